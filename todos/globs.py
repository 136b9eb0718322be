"""Scope globs matched as data, never as code (issue 28, finding H1).

A scope, a claim's ``queues`` item and a long-poll's globs use ``*`` (any run, the empty one included) and
``?`` (one character); nothing else is special (todos.models' validators allow no ``[``). The SQL side
turns the same glob into a LIKE pattern (todos.models.glob_to_like); this module is the Python side.

No pattern ever becomes a regular expression: a backtracking regex of k ``.*`` groups tried against an
n-character name costs about C(k + n, n) steps, and ``re`` holds the GIL while it runs, so one claim of
199 stars froze a whole web process. Here a glob is split at its stars into fixed-width segments. The
first must sit at the start of the name and the last at its end; each one between is taken at its
leftmost place after the one before. Leftmost is always right: it leaves the most of the name to the
segments after it. Each segment is found with ``str.find`` on its longest literal run, and its ``?``
positions need no check. A match therefore costs at most O(len(glob) * len(name)) character comparisons,
most of them done by ``str.find`` in C, whatever the input.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

# Runs of * mean what one * means; collapsing them first keeps the count of wildcards honest.
_STAR_RUN = re.compile(r"\*{2,}")


def collapse_stars(pattern: str) -> str:
    """``a***b`` -> ``a*b``: the same set of names, and fewer wildcards to count."""
    return _STAR_RUN.sub("*", pattern)


def wildcards(pattern: str) -> int:
    """How many wildcards (``*`` and ``?``) the pattern holds once its runs of ``*`` are collapsed."""
    collapsed = collapse_stars(pattern)
    return collapsed.count("*") + collapsed.count("?")


class _Segment:
    """A piece of a glob between two stars: fixed width, ``?`` matching any one character."""

    __slots__ = ("anchor", "offset", "pieces", "width")

    def __init__(self, text: str) -> None:
        self.width = len(text)
        # The literal runs between the ? marks, with their offsets in the segment.
        self.pieces: list[tuple[int, str]] = []
        start = 0
        for run in text.split("?"):
            if run:
                self.pieces.append((start, run))
            start += len(run) + 1
        # The longest literal run is what str.find looks for; the others are checked where it lands.
        self.offset, self.anchor = max(self.pieces, key=lambda p: len(p[1]), default=(0, ""))

    def at(self, name: str, position: int) -> bool:
        """Does the segment match ``name`` at ``position``? (The caller checked that it fits.)"""
        return all(name.startswith(run, position + offset) for offset, run in self.pieces)

    def find(self, name: str, start: int, end: int) -> int:
        """The leftmost position >= ``start`` where the segment matches and ends by ``end``; -1 if none."""
        last = end - self.width  # the last position it may start at
        if not self.anchor:  # only ? marks: any place with room will do
            return start if start <= last else -1
        position = start
        while position <= last:
            hit = name.find(self.anchor, position + self.offset, last + self.offset + len(self.anchor))
            if hit < 0:
                return -1
            position = hit - self.offset
            if self.at(name, position):
                return position
            position += 1
        return -1


class Glob:
    """One compiled glob: ``Glob("github.*").matches("github.pulls")``. Build it with ``compile_glob``
    (cached) rather than directly."""

    __slots__ = ("_head", "_middle", "_shortest", "_tail", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        parts = pattern.split("*")
        self._head = _Segment(parts[0])
        # No star: the whole name is the head, and _tail stays None.
        self._tail = _Segment(parts[-1]) if len(parts) > 1 else None
        self._middle = [_Segment(p) for p in parts[1:-1] if p]
        self._shortest = len(pattern) - pattern.count("*")

    def matches(self, name: str) -> bool:
        if self._tail is None:
            return len(name) == self._head.width and self._head.at(name, 0)
        if len(name) < self._shortest or not self._head.at(name, 0):
            return False
        end = len(name) - self._tail.width
        if not self._tail.at(name, end):
            return False
        position = self._head.width
        for segment in self._middle:
            position = segment.find(name, position, end)
            if position < 0:
                return False
            position += segment.width
        return True

    def __repr__(self) -> str:
        return f"Glob({self.pattern!r})"


# Agents' scopes are few and the same on every request; a claim's own globs come and go. Bounded either way.
@functools.lru_cache(maxsize=4096)
def compile_glob(pattern: str) -> Glob:
    return Glob(collapse_stars(pattern))


def matches_any(patterns: Iterable[str], name: str) -> bool:
    """Does any of the globs match ``name``?"""
    return any(compile_glob(p).matches(name) for p in patterns)
