"""Ids have one shape, defined once (switchboard/ids.py), and every generator makes that shape."""

from __future__ import annotations

import pytest

from events.models import new_event_id
from switchboard import ids
from todos.models import new_todo_id


def test_generated_ids_have_the_shape_of_their_kind():
    assert ids.is_id(new_todo_id(), ids.TODO) and ids.is_id(new_event_id(), ids.EVENT)
    assert not ids.is_id(new_todo_id(), ids.EVENT) and not ids.is_id(new_event_id(), ids.TODO)


@pytest.mark.parametrize(
    "value",
    [
        "td_" + "0" * 31,  # too short
        "td_" + "0" * 33,  # too long
        "td_" + "A" * 32,  # hex is lowercase
        "TD_" + "0" * 32,
        "td-" + "0" * 32,
        "td_" + "0" * 31 + "\x00",
        " td_" + "0" * 32,
        "td_" + "0" * 32 + "\n",
    ],
)
def test_values_of_another_shape_are_not_ids(value):
    assert not ids.is_id(value, ids.TODO)
