"""How a todo reads in the admin: its state badge, pretty JSON, and the timeline of its life."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.timesince import timesince, timeuntil

from todos import states
from todos.limits import MAX_SHOWN_JSON_CHARS
from todos.models import Todo, last_error

__all__ = ["last_error"]  # the list column, the triage groups and the last-error filter read it from here


def state_badge(todo: Todo) -> SafeString:
    label = states.label(todo)
    # Colours come from the admin's own CSS variables (todos/static/todos/admin.css), so the badges
    # follow its light and dark themes.
    return format_html('<span class="sb-state sb-state-{}">{}</span>', label, label)


def pretty_json(value: Any) -> SafeString:
    if value is None:
        return format_html('<span class="quiet">{}</span>', "none")
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    if len(text) > MAX_SHOWN_JSON_CHARS:
        text = text[:MAX_SHOWN_JSON_CHARS] + "\n… (truncated)"
    return format_html('<pre class="sb-json">{}</pre>', text)


def relative(when: datetime | None) -> str:
    if when is None:
        return "—"
    now = timezone.now()
    # One unit ("3 days", not "3 days, 4 hours"): the list's age and due columns stay one short line.
    return f"in {timeuntil(when, now, depth=1)}" if when > now else f"{timesince(when, now, depth=1)} ago"


def _parse(at: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(at))
    except ValueError:
        return None


def _describe_error_entry(entry: dict[str, Any]) -> tuple[str, str]:
    error = str(entry.get("error", ""))
    attempt = entry.get("attempt")
    who = entry.get("operator")
    if error == "operator retry":
        detail = f"by {who}, mode {entry.get('mode')}" + (f": {entry['note']}" if entry.get("note") else "")
        return "operator retry", detail
    if error in ("operator retry now", "operator run now", "operator force-release"):
        extra = f" (was held by {entry['owner']})" if entry.get("owner") else ""
        return error, f"by {who}{extra}"
    if error == "lease expired":
        return "lease lapsed", f"attempt {attempt}"
    return "failed", f"attempt {attempt}: {error}" if error else f"attempt {attempt}"


def timeline(todo: Todo) -> list[tuple[datetime | None, str, str]]:
    """created, each failure, lapse and operator step from ``errors``, the current claim, completion."""
    events: list[tuple[datetime | None, str, str]] = [(todo.created_at, "created", f"in {todo.queue}")]
    for entry in todo.errors or []:
        if isinstance(entry, dict):
            events.append((_parse(entry.get("at")), *_describe_error_entry(entry)))
    if todo.claimed_at:
        events.append((todo.claimed_at, "claimed (latest)", f"attempt {todo.attempt}, by {todo.owner or '—'}"))
    if todo.completed_at:
        result = todo.result if isinstance(todo.result, dict) else {}
        if "discarded_by" in result:
            events.append((todo.completed_at, "discarded", f"by {result['discarded_by']}: {result.get('reason', '')}"))
        else:
            events.append((todo.completed_at, "done", ""))
    epoch = datetime.min.replace(tzinfo=timezone.get_current_timezone())
    return sorted(events, key=lambda e: e[0] or epoch)


def timeline_html(todo: Todo) -> SafeString:
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td><strong>{}</strong></td><td>{}</td></tr>",
        ((when.strftime("%Y-%m-%d %H:%M:%S") if when else "?", what, detail) for when, what, detail in timeline(todo)),
    )
    return format_html('<table class="sb-timeline"><tbody>{}</tbody></table>', rows)
