"""Issue 28: inputs a compromised agent (or an anonymous client) sends to make the server misbehave:
system idempotency keys it should not be able to take, and bytes that used to reach SQL or the
paginator and come back as a 500. Each answer is a 4xx naming what was wrong, and nothing changed."""

from __future__ import annotations

import anyio
import pytest
from rest_framework.exceptions import ValidationError

from todos.errors import InvalidTransitionInput
from todos.mcp import tools
from todos.models import Todo

# --- L3: the system's idempotency keys are not the agents' ----------------------------------------


@pytest.mark.parametrize("key", ["ingest:del-1001:7", "schedule:nightly:2026-12-05T02:30:00Z"])
def test_an_agent_cannot_create_under_a_system_key(api, key):
    response = api.post("/todos/", {"queue": "support", "idempotency_key": key, "payload": {"x": 1}})
    assert response.status_code == 400
    assert "idempotency_key" in response.json()["error"]["fields"]
    assert Todo.objects.count() == 0


def test_an_agent_cannot_batch_create_under_a_system_key(api):
    items = [{"queue": "support", "idempotency_key": "mine"}, {"queue": "support", "idempotency_key": "ingest:1:7"}]
    response = api.post("/todos/batch/", {"todos": items})
    assert response.status_code == 400
    assert "todos.1.idempotency_key" in response.json()["error"]["fields"]
    assert Todo.objects.count() == 0


@pytest.mark.parametrize(
    "args",
    [
        {"queue": "support", "idempotency_key": "ingest:1:7"},
        {"todos": [{"queue": "support", "idempotency_key": "schedule:x:2026-01-01T00:00:00Z"}]},
    ],
)
@pytest.mark.django_db(transaction=True)  # the tool runs its statements in the executor's threads
def test_the_mcp_create_for_tool_refuses_a_system_key(agent, args):
    # The tool's own refusals, which the MCP server answers as -32602 with the REST error body.
    with pytest.raises((ValidationError, InvalidTransitionInput)) as refused:
        anyio.run(tools.create_for, agent, args)
    fields = refused.value.detail if isinstance(refused.value, ValidationError) else refused.value.extra["fields"]
    assert any(name.endswith("idempotency_key") for name in fields)  # type: ignore[union-attr]
    assert Todo.objects.count() == 0


def test_keys_that_only_look_alike_are_the_agents(api):
    # Keys are compared exactly, as the unique index compares them: these never collide with a system key.
    for key in ("Ingest:1:7", "my-ingest:1:7", "ingest-1-7", "schedule"):
        assert api.post("/todos/", {"queue": "support", "idempotency_key": key}).status_code == 201
