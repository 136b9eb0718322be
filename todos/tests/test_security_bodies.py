"""Deep JSON from a hostile agent (issue 28, L1): every value taken from a caller and walked or encoded
again is refused with a 400 naming its field, never a 500 from a RecursionError somewhere further down.
The bodies themselves (size, chunking, the raw parse) are switchboard/tests/test_security_bodies.py's,
on the live server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from todos.limits import MAX_JSON_DEPTH
from todos.models import Todo, TodoState
from todos.tests.conftest import Api

pytestmark = pytest.mark.django_db


def _nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


NUL = '"\\u0000"'


@pytest.mark.parametrize("depth", [600, 900])
def test_a_deep_payload_with_a_nul_at_the_bottom_is_a_400_naming_the_payload(api: Api, depth: int) -> None:
    # The NUL sent the old recursive check 2 frames a level down: a RecursionError, a 500.
    created = api.post("/todos/", '{"queue": "q", "payload": ' + _nested(depth, NUL) + "}")
    assert created.status_code == 400 and "payload" in created.json()["error"]["fields"], created.content[:300]
    batch = api.post("/todos/batch/", '{"todos": [{"queue": "q", "payload": ' + _nested(depth, NUL) + "}]}")
    assert batch.status_code == 400 and "todos.0.payload" in str(batch.json()), batch.content[:300]
    assert not Todo.objects.exists()


def test_a_deep_result_and_checkpoint_are_400s_and_the_lease_is_untouched(
    api: Api, make_todo: Callable[..., Todo]
) -> None:
    todo = make_todo("q")
    claimed = api.post(f"/todos/{todo.id}/claim/").json()
    lease = claimed["lease_id"]
    deep = _nested(600, NUL)
    completed = api.post(f"/todos/{todo.id}/complete/", f'{{"lease_id": "{lease}", "result": {deep}}}')
    assert completed.status_code == 400 and "result" in completed.json()["error"]["fields"]
    beat = api.post(f"/todos/{todo.id}/heartbeat/", f'{{"lease_id": "{lease}", "checkpoint": {{"a": {deep}}}}}')
    assert beat.status_code == 400 and "checkpoint" in beat.json()["error"]["fields"]
    todo.refresh_from_db()
    assert todo.state == TodoState.CLAIMED and todo.result is None


def test_a_token_resolution_nested_900_deep_is_a_400_and_the_wait_stays_open(
    api: Api, make_todo: Callable[..., Todo], client: Any
) -> None:
    # Accepted by the serializer at its own stack depth, this failed as a 500 in psycopg's encoder.
    claimed = api.post(f"/todos/{make_todo('q').id}/claim/").json()
    waited = api.post(
        f"/todos/{claimed['id']}/wait/",
        {"lease_id": claimed["lease_id"], "for": {"token": True}, "timeout_seconds": 60},
    ).json()
    url = waited["waitpoint"]["resolve_url"]
    refused = client.post(url, '{"data": ' + _nested(900) + "}", content_type="application/json")
    assert refused.status_code == 400 and "data" in refused.json()["error"]["fields"], refused.content[:300]
    assert Todo.objects.get(pk=claimed["id"]).state == TodoState.WAITING
    assert client.post(url, {"data": {"ok": True}}, content_type="application/json").status_code == 200


def test_nesting_is_bounded_at_max_json_depth(api: Api) -> None:
    at_the_bound = api.post("/todos/", '{"queue": "q", "payload": ' + _nested(MAX_JSON_DEPTH) + "}")
    assert at_the_bound.status_code == 201
    past_it = api.post("/todos/", '{"queue": "q", "payload": ' + _nested(MAX_JSON_DEPTH + 1) + "}")
    assert past_it.status_code == 400
    assert f"more than {MAX_JSON_DEPTH} levels" in str(past_it.json()["error"]["fields"]["payload"])
