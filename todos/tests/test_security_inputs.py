"""Issue 28: inputs a compromised agent (or an anonymous client) sends to make the server misbehave:
system idempotency keys it should not be able to take, and bytes that used to reach SQL or the
paginator and come back as a 500. Each answer is a 4xx naming what was wrong, and nothing changed."""

from __future__ import annotations

import base64
import json
import logging
import logging.config
from collections import Counter
from typing import Any
from urllib.parse import quote, urlencode

import anyio
import pytest
import schemathesis
from django.conf import settings
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from rest_framework.exceptions import ValidationError
from schemathesis import GenerationMode
from switchboard_client import cli

from switchboard.logs import logging_config
from switchboard.wsgi import application as wsgi_application
from todos import queue
from todos.errors import InvalidTransitionInput
from todos.mcp import tools
from todos.models import Queue, Todo

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


# --- L1: NUL bytes, odd cursors and odd numbers are 4xx, never a 500 ------------------------------


def _cursor(position: str) -> str:
    # DRF's cursor: base64 of a query string whose p is the position (here, a created_at).
    return base64.b64encode(urlencode({"p": position}).encode()).decode()


@pytest.mark.parametrize(
    "path",
    [
        "/queues/a%00b/",
        "/queues/a%00b/pause/",
        "/todos/?queue=a%00b",
        "/todos/?kind=a%00b",
        "/todos/?state=pending%00",
        "/events/?source=a%00b",
        "/events/?type=a%00b",
        "/events/ev_%00/",
        "/todos/td_%00/",
        "/todos/?cursor=" + _cursor("x"),
        "/todos/?cursor=" + _cursor("\u00b2"),
        "/todos/?cursor=" + _cursor("9" * 5000),
        "/events/?cursor=" + _cursor("x"),
    ],
)
def test_a_hostile_path_or_query_is_a_4xx_json_error_not_a_500(api, path):
    response = api.post(path) if path.endswith("/pause/") else api.get(path)
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:300])
    assert response.json()["error"]["code"] in ("invalid", "not_found")


def test_a_nul_in_a_fair_weights_key_is_400_naming_the_field(make_agent, api_for, make_todo):
    make_todo("fairq")
    manager = api_for(make_agent("ops", claim=["*"], create=["*"], can_manage_queues=True))
    response = manager.client.patch(
        "/api/v1/queues/fairq/", data='{"fair_weights": {"a\\u0000": 2}}', content_type="application/json"
    )
    assert response.status_code == 400, response.content
    assert "fair_weights" in response.json()["error"]["fields"]
    assert not Queue.objects.get(name="fairq").fair_weights


@pytest.mark.parametrize(
    "wait_for",
    [{"todos": ["td_\u0000"]}, {"event": {"source": "a\u0000b"}}, {"event": {"source": "gh", "type": "\u0000"}}],
)
def test_a_value_postgresql_refuses_is_400_whatever_door_it_came_through(api, make_todo, wait_for):
    # The net under the explicit checks: a NUL that reaches a statement (here in a wait's description,
    # which other checks may refuse first, 400 or 404) is psycopg's DataError, answered 400 `invalid`.
    todo = make_todo("jobs")
    lease = api.post(f"/todos/{todo.id}/claim/", {}).json()["lease_id"]
    response = api.post(f"/todos/{todo.id}/wait/", {"lease_id": lease, "for": wait_for, "timeout_seconds": 60})
    assert response.status_code in (400, 404), response.content
    assert response.json()["error"]["code"] in ("invalid", "not_found")
    assert Todo.objects.get(pk=todo.id).state == "claimed"


# --- L1 in the admin (staff only, but a 500 all the same) -----------------------------------------


def test_the_bulk_forms_carried_values_cannot_make_a_500(admin_client, make_todo):
    for n in range(2):
        make_todo("github", title=f"dead {n}", state="failed", next_retry_at=None, attempt=5, max_attempts=5)
    url = reverse("admin:todos_todo_bulk", args=["retry_reset"]) + "?dead=yes"
    deep = "[" * 100_000 + "]" * 100_000
    response = admin_client.post(url, {"skipped": deep, "after": "td_\x00", "note": "a\x00b"}, follow=True)
    assert response.status_code == 200
    assert not Todo.objects.dead_lettered().exists()


# --- Info: what reaches the logs -------------------------------------------------------------------


@pytest.mark.parametrize("log_format", ["plain", "json"])
def test_at_log_level_debug_the_mcp_sdk_still_logs_no_messages(log_format):
    # The SDK logs each JSON-RPC message it sends at DEBUG (mcp/server/sse.py, "Sending message via SSE"):
    # arguments, payloads, lease ids, waitpoint tokens. Pinned at INFO, as query logging is.
    config = logging_config(log_format, "DEBUG")
    for name in ("mcp", "django.db.backends"):
        assert logging.getLevelName(config["loggers"][name]["level"]) > logging.DEBUG
    logging.config.dictConfig(config)
    try:
        assert not logging.getLogger("mcp.server.sse").isEnabledFor(logging.DEBUG)
        assert not logging.getLogger("mcp.shared.jsonrpc_dispatcher").isEnabledFor(logging.DEBUG)
    finally:
        logging.config.dictConfig(settings.LOGGING)


def test_the_cli_warns_that_a_token_flag_is_visible_to_other_users(capsys, monkeypatch):
    monkeypatch.delenv("SWITCHBOARD_TOKEN", raising=False)
    # Nothing listens on the discard port: the command fails as "server down", after the warning.
    cli.main(["queues", "list", "--url", "http://127.0.0.1:9", "--token", "sb_from_the_command_line"])
    assert cli.VISIBLE_FLAG_WARNING in capsys.readouterr().err
    cli.main(["queues", "list", "--url", "http://127.0.0.1:9"])
    assert cli.VISIBLE_FLAG_WARNING not in capsys.readouterr().err


# --- Build 9: the schema-driven fuzz run, every string poisoned -----------------------------------

_DEEP = 5_000  # past Python's recursion limit (1,000) for any recursive walk of the parsed JSON
_NESTED = "\u2063deep\u2063"  # a marker no generated string contains: replaced by the nested JSON text


def _poisoned(value: Any, how: str) -> Any:
    """Every string of ``value`` with a NUL in it ("nul"), or replaced by JSON nested _DEEP deep ("deep")."""
    if isinstance(value, str):
        return _NESTED if how == "deep" else value[:1] + "\x00" + value[1:]
    if isinstance(value, dict):
        return {key: _poisoned(item, how) for key, item in value.items()}
    if isinstance(value, list):
        return [_poisoned(item, how) for item in value]
    return value


def _send(client: Client, case: Any, how: str, token: str) -> int:
    """The generated request, poisoned: path parameters and query values get NUL bytes (a URL cannot carry
    nesting), the JSON body gets NULs or deep nesting in every string."""
    path = case.operation.path
    for name, value in (case.path_parameters or {}).items():
        path = path.replace("{" + name + "}", quote(_poisoned(str(value), "nul"), safe=""))
    query = {name: _poisoned(str(value), "nul") for name, value in (case.query or {}).items()}
    body = ""
    if isinstance(case.body, dict | list):
        body = json.dumps(_poisoned(case.body, how)).replace(json.dumps(_NESTED), "[" * _DEEP + "]" * _DEEP)
    url = path + ("?" + urlencode(query) if query else "")
    send = getattr(client, case.method.lower())
    response = send(url, data=body, content_type="application/json", headers={"Authorization": f"Bearer {token}"})
    return int(response.status_code)


@pytest.mark.slow
def test_fuzzing_every_operation_with_nul_bytes_and_deep_nesting_finds_no_server_error(transactional_db, make_agent):
    agent = make_agent("fuzzer", claim=["*"], can_retry_dead_letters=True, can_manage_queues=True)
    token = agent.token  # type: ignore[attr-defined]
    real = [queue.create(queue=f"fuzz.{i}")[0].id for i in range(2)]
    queue.claim(real[1], agent=agent)
    schema = schemathesis.openapi.from_wsgi("/api/schema/", wsgi_application)
    operations = [result.ok() for result in schema.get_all_operations()]
    client = Client(raise_request_exception=False)
    server_errors: list[str] = []
    statuses: Counter[int] = Counter()

    def fuzz(operation: Any, how: str) -> None:
        @given(case=operation.as_strategy(GenerationMode.POSITIVE))
        @hypothesis_settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def call(case: Any) -> None:
            if isinstance(case.body, dict) and isinstance(case.body.get("wait_seconds"), int | float):
                case.body["wait_seconds"] = 0  # long-polls are the live server's tests
            status = _send(client, case, how, token)
            statuses[status] += 1
            if status >= 500:
                server_errors.append(f"{operation.label} ({how}): {status} for {case.body!r:.200}")

        call()

    for operation in operations:
        for how in ("nul", "deep"):
            fuzz(operation, how)
    assert server_errors == []
    # Bounded (CI has 2 cores): a few hundred requests, and they did reach the views.
    assert 2 * len(operations) <= sum(statuses.values()) <= 8 * len(operations), statuses
    assert {400, 404} <= set(statuses), statuses
