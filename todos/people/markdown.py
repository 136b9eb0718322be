"""The question's markdown, rendered safely (issue 29): everything is escaped first, then a tiny subset
is turned back into tags: paragraphs, ``-``/``*`` lists, **bold**, `code` and [links](https://...) whose
target is http or https (anything else stays text). No raw HTML, no images, no other scheme: the body
comes from an agent, and every agent token is assumed compromised (issue 28)."""

from __future__ import annotations

import re

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

# On escaped text: & < > " ' are entities, so none of these can open a tag or leave an attribute.
_CODE = re.compile(r"`([^`\n]{1,500})`")
_BOLD = re.compile(r"\*\*([^*\n]{1,500})\*\*")
_ITEM = re.compile(r"^\s*[-*] ")
_LINK = re.compile(r"\[([^\]\n]{1,300})\]\((https?://[^\s()<>]{1,2000})\)")


def _inline(text: str) -> str:
    codes: list[str] = []

    def keep(match: re.Match[str]) -> str:
        codes.append(f"<code>{match.group(1)}</code>")
        return f"\x00{len(codes) - 1}\x00"

    text = _CODE.sub(keep, text)  # code spans first: nothing inside them is markup
    text = _BOLD.sub(r"<strong>\1</strong>", text)
    text = _LINK.sub(r'<a href="\2" rel="noopener noreferrer nofollow">\1</a>', text)
    return re.sub("\x00(\\d+)\x00", lambda m: codes[int(m.group(1))], text)


def render(source: str) -> SafeString:
    """Safe HTML for a question's body."""
    blocks = re.split(r"\n\s*\n", escape(source.replace("\x00", "").replace("\r\n", "\n")).strip())
    html: list[str] = []
    for block in blocks:
        lines = [line.rstrip() for line in block.split("\n") if line.strip()]
        if not lines:
            continue
        if all(_ITEM.match(line) for line in lines):
            items = "".join("<li>" + _inline(_ITEM.sub("", line)) + "</li>" for line in lines)
            html.append(f"<ul>{items}</ul>")
        else:
            html.append("<p>" + "<br>".join(_inline(line) for line in lines) + "</p>")
    return mark_safe("\n".join(html))  # noqa: S308 (built from escaped text: see the module's docstring)
