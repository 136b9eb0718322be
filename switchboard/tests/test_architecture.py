"""docs/architecture.md stays true where a test can tell: its state table names exactly the states the
model stores, and every module or folder it names exists."""

from __future__ import annotations

import re

from switchboard.tests.conftest import ROOT
from todos.models import TodoState

DOC = (ROOT / "docs" / "architecture.md").read_text()
DERIVED = "*(derived)*"


def _state_rows() -> list[str]:
    section = DOC.split("\n## States\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_the_state_table_names_every_stored_state_and_only_those():
    stored = [re.match(r"\| `([a-z-]+)`", row)[1] for row in _state_rows() if DERIVED not in row]
    assert sorted(stored) == sorted(TodoState.values)


def test_each_derived_state_says_which_stored_state_it_is_part_of():
    for row in _state_rows():
        if DERIVED in row:
            stored_as = row.split("|")[2]
            assert any(f"`{value}`" in stored_as for value in TodoState.values), row


def test_every_module_the_page_names_exists():
    named = {text for text in re.findall(r"`([^`\s]+)`", DOC) if re.fullmatch(r"[a-z_]+(?:/[a-z_]+)*(?:\.py|/)", text)}
    assert len(named) > 20  # the pattern finds them
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert missing == []


def test_every_transition_the_state_table_names_is_a_queue_function():
    from todos import queue

    named = {
        name
        for row in _state_rows()
        for column in row.split("|")[3:5]
        for name in re.findall(r"`([a-z_]+)`", column)
        if name not in TodoState.values
    }
    assert {"claim_next", "requeue_lapsed", "retry_dead_letter"} <= named
    assert sorted(name for name in named if not callable(getattr(queue, name, None))) == []
