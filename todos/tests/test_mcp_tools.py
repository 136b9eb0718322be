"""The MCP tools, through the official mcp 2.x client (and raw JSON-RPC where the wire itself is the
subject) against a live uvicorn server on switchboard.asgi and the test database."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
import requests
from django.db import connection
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

import switchboard
from todos import queue
from todos.api.serializers import TodoCreateInput, TodoSerializer
from todos.mcp import tools
from todos.models import Agent, Todo, TodoState
from todos.tests.mcp_live import GUNICORN_UVICORN, live_server, mcp_base, mcp_client

__all__ = ["mcp_base"]  # the fixture, imported for pytest

pytestmark = pytest.mark.django_db(transaction=True)

TOOL_NAMES = {
    "list_todos",
    "get_todo",
    "claim",
    "heartbeat",
    "complete",
    "fail",
    "release",
    "create_for",
    "list_queues",
    "wait",
    "explain",
}
ACCEPT = "application/json, text/event-stream"


def run(base: str, token: str | None, scenario: Callable[[Any], Awaitable[Any]], mode: str = "auto") -> Any:
    async def main() -> Any:
        async with mcp_client(base, token, mode) as client:
            return await scenario(client)

    return anyio.run(main)


def ok(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.structured_content
    assert json.loads(result.content[0].text) == result.structured_content
    return dict(result.structured_content)


def error(result: Any) -> dict[str, Any]:
    # The body is the text; structuredContent would have to match the output schema, which describes
    # success (clients that validate it turned an error there into -32602).
    assert result.is_error and result.structured_content is None, result
    return dict(json.loads(result.content[0].text)["error"])


def rpc(
    base: str,
    token: str | None,
    method: str,
    params: dict[str, Any],
    version: str | None = None,
    headers: dict[str, str] | None = None,
) -> Any:
    headers = {"Accept": ACCEPT, **(headers or {})}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if version:
        headers["MCP-Protocol-Version"] = version
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return requests.post(base + "/mcp", json=body, headers=headers, timeout=30)


# --- the list ---------------------------------------------------------------------------------


def test_initialize_then_list_tools_gives_the_nine_tools_each_with_an_output_schema(mcp_base, agent):
    async def scenario(client: Any) -> Any:
        return (client.server_info, await client.list_tools())

    info, listed = run(mcp_base, agent.token, scenario, mode="legacy")
    assert info.name == "switchboard"
    assert {t.name for t in listed.tools} == TOOL_NAMES
    assert all(t.output_schema and t.output_schema["type"] == "object" for t in listed.tools)
    assert all(t.description and len(t.description) < 200 for t in listed.tools)


def test_the_tool_list_on_the_wire_is_under_7_kb_of_json(mcp_base, agent):
    response = rpc(mcp_base, agent.token, "tools/list", {}, version="2025-11-25")
    assert response.status_code == 200
    listed = response.json()["result"]["tools"]
    assert {t["name"] for t in listed} == TOOL_NAMES
    size = len(json.dumps(listed, separators=(",", ":")).encode())
    assert size < 7 * 1024, f"the tool list is {size} bytes of JSON"


def test_the_todo_schema_names_only_fields_the_rest_api_renders():
    assert set(tools.TODO_SCHEMA["properties"]) <= set(TodoSerializer.Meta.fields)
    assert set(tools.CREATE_FOR_PROPERTIES) <= set(TodoCreateInput().fields)


# --- a todo's life ----------------------------------------------------------------------------


def test_a_todo_lives_its_whole_life_through_tools_and_reads_as_rest_renders_it(mcp_base, agent):
    async def scenario(client: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        made = ok(
            await client.call_tool(
                "create_for",
                {
                    "queue": "jobs",
                    "kind": "review",
                    "title": "Review PR 7",
                    "payload": {"pr": 7},
                    "idempotency_key": "k1",
                },
            )
        )
        assert made["created"] is True
        todo_id = made["todo"]["id"]
        again = ok(await client.call_tool("create_for", {"queue": "jobs", "idempotency_key": "k1"}))
        assert again == {"todo": made["todo"], "created": False}
        listed = ok(await client.call_tool("list_todos", {"queue": "jobs", "state": "pending"}))
        assert [t["id"] for t in listed["todos"]] == [todo_id]
        queues = ok(await client.call_tool("list_queues", {}))
        assert {"queue": "jobs", "pending": 1, "claimed": 0} | queues["queues"][0] == queues["queues"][0]

        first = ok(await client.call_tool("claim", {"queues": ["jobs"], "lease_seconds": 60}))["todo"]
        assert (first["id"], first["state"], first["attempt"], first["payload"]) == (todo_id, "claimed", 1, {"pr": 7})
        beat = ok(
            await client.call_tool("heartbeat", {"id": todo_id, "lease_id": first["lease_id"], "lease_seconds": 120})
        )
        assert beat["todo"]["lease_expires_at"] > first["lease_expires_at"]
        failed = ok(
            await client.call_tool(
                "fail", {"id": todo_id, "lease_id": first["lease_id"], "error": "flaky", "retry_in_seconds": 0}
            )
        )
        assert failed["todo"]["state"] == "failed"
        assert failed["todo"]["errors"][-1]["error"] == "flaky"

        second = ok(await client.call_tool("claim", {"id": todo_id}))["todo"]
        assert second["attempt"] == 2 and second["lease_id"] != first["lease_id"]
        released = ok(await client.call_tool("release", {"id": todo_id, "lease_id": second["lease_id"]}))
        assert released["todo"]["state"] == "pending" and released["todo"]["attempt"] == 1

        third = ok(await client.call_tool("claim", {}))["todo"]
        done = ok(
            await client.call_tool("complete", {"id": todo_id, "lease_id": third["lease_id"], "result": {"ok": 1}})
        )
        assert done["todo"]["state"] == "done" and done["todo"]["result"] == {"ok": 1}
        out["read"] = ok(await client.call_tool("get_todo", {"id": todo_id}))["todo"]
        out["none_left"] = ok(await client.call_tool("claim", {}))
        return out

    out = run(mcp_base, agent.token, scenario)
    todo = Todo.objects.get()
    assert todo.state == TodoState.DONE and todo.owner == "alice"
    assert out["read"] == json.loads(json.dumps(TodoSerializer(todo).data))
    assert out["none_left"] == {"todo": None}


def test_an_agent_waits_through_the_tool_and_get_todo_shows_the_resolution(mcp_base, agent):
    queue.create(queue="jobs", title="needs a person")

    async def scenario(client: Any) -> dict[str, Any]:
        claimed = ok(await client.call_tool("claim", {}))["todo"]
        bad = await client.call_tool(
            "wait", {"id": claimed["id"], "lease_id": claimed["lease_id"], "for": {"token": True}}
        )
        assert "timeout_seconds" in error(bad)["fields"]
        waited = ok(
            await client.call_tool(
                "wait",
                {"id": claimed["id"], "lease_id": claimed["lease_id"], "for": {"token": True}, "timeout_seconds": 60},
            )
        )
        assert waited["todo"]["state"] == "waiting"
        origin = mcp_base.split("/mcp", 1)[0]
        url = origin + waited["waitpoint"]["resolve_url"]
        resolved = await anyio.to_thread.run_sync(lambda: requests.post(url, json={"data": {"ok": 1}}, timeout=10))
        assert resolved.status_code == 200
        return ok(await client.call_tool("get_todo", {"id": claimed["id"]}))["todo"]

    read = run(mcp_base, agent.token, scenario)
    assert read["state"] == "pending" and read["resolution"]["data"] == {"ok": 1}


def test_a_waiting_claim_is_woken_by_a_todo_created_meanwhile(mcp_base, agent):
    def create_later() -> None:
        time.sleep(0.5)
        try:
            queue.create(queue="later", title="arrives")
        finally:
            connection.close()  # this thread's own connection

    creator = threading.Thread(target=create_later)

    async def scenario(client: Any) -> Any:
        creator.start()
        started = time.monotonic()
        result = ok(await client.call_tool("claim", {"queues": ["later"], "wait_seconds": 15}))
        return result, time.monotonic() - started

    result, elapsed = run(mcp_base, agent.token, scenario)
    creator.join()
    assert result["todo"]["title"] == "arrives" and result["todo"]["state"] == "claimed"
    assert elapsed < 14  # woken, not timed out


# --- refusals ---------------------------------------------------------------------------------


def test_create_for_takes_a_batch_whose_items_depend_on_earlier_ones(mcp_base, agent):
    async def scenario(client: Any) -> Any:
        todos = [{"queue": "jobs", "kind": "check"}, {"queue": "jobs", "kind": "merge", "depends_on_index": [0]}]
        return ok(await client.call_tool("create_for", {"todos": todos}))

    made = run(mcp_base, agent.token, scenario)["outcomes"]
    assert [(o["status"], o["state"]) for o in made] == [(201, "pending"), (201, "waiting")]
    assert Todo.objects.get(pk=made[1]["id"]).depends_on == [made[0]["id"]]


def test_create_for_takes_issue_31s_create_controls_as_rest_does(mcp_base, agent):
    # supersede, debounce_seconds and a start-by deadline reach queue.create over MCP as over REST; a bad
    # value is refused naming the field and creates nothing.
    async def scenario(client: Any) -> list[Any]:
        key = {"queue": "jobs", "idempotency_key": "pr-7"}
        return [
            ok(await client.call_tool("create_for", {**key, "title": "commit a", "expire_after_seconds": 600})),
            ok(await client.call_tool("create_for", {**key, "title": "commit b", "supersede": True})),
            ok(await client.call_tool("create_for", {"queue": "jobs", "idempotency_key": "d", "debounce_seconds": 30})),
            ok(await client.call_tool("create_for", {"queue": "jobs", "idempotency_key": "d", "debounce_seconds": 30})),
            error(await client.call_tool("create_for", {"queue": "jobs", "expires_at": "tomorrow"})),
        ]

    first, second, debounced, again, bad = run(mcp_base, agent.token, scenario)
    old, new = Todo.objects.get(pk=first["todo"]["id"]), Todo.objects.get(pk=second["todo"]["id"])
    assert old.expires_at is not None and old.state == TodoState.CANCELLED
    assert old.errors[-1]["reason"] == "superseded"
    assert second["created"] and new.state == TodoState.PENDING and new.title == "commit b"
    assert debounced["created"] and not again["created"] and again["todo"]["id"] == debounced["todo"]["id"]
    assert Todo.objects.get(pk=again["todo"]["id"]).state == TodoState.SCHEDULED  # run_at moved on
    assert bad["code"] == "invalid" and "expires_at" in bad["fields"]
    assert Todo.objects.filter(queue="jobs").count() == 3


def test_another_agents_todo_is_not_found_and_not_listed(mcp_base, make_agent, make_todo):
    bob = make_agent("bob", claim=["bob.*"])
    theirs = make_todo("alice.jobs")
    claimed = queue.claim(theirs.id, agent=make_agent("alice", claim=["alice.*"]))

    async def scenario(client: Any) -> list[Any]:
        return [
            error(await client.call_tool("get_todo", {"id": theirs.id})),
            error(await client.call_tool("claim", {"id": theirs.id})),
            error(await client.call_tool("complete", {"id": theirs.id, "lease_id": claimed.lease_id})),
            error(await client.call_tool("create_for", {"queue": "alice.jobs"})),
            ok(await client.call_tool("list_todos", {})),
            ok(await client.call_tool("list_queues", {})),
            error(await client.call_tool("claim", {"queues": ["alice.*"]})),
        ]

    got, claimed_again, completed, created, listed, queues, next_one = run(mcp_base, bob.token, scenario)
    assert [got["code"], claimed_again["code"], completed["code"]] == ["not_found"] * 3
    assert created["code"] == "invalid" and "queue" in created["fields"]
    assert listed == {"todos": []} and queues == {"queues": []}
    # Naming queues outside its scopes is refused outright (as over REST), not an empty wait.
    assert next_one["code"] == "forbidden" and next_one["queues"] == ["alice.*"]
    assert Todo.objects.get().state == TodoState.CLAIMED  # untouched


def test_a_stale_lease_is_a_conflict_carrying_the_current_state(mcp_base, agent, make_todo):
    todo = make_todo("jobs")

    async def scenario(client: Any) -> Any:
        held = ok(await client.call_tool("claim", {"id": todo.id}))["todo"]
        ok(await client.call_tool("release", {"id": todo.id, "lease_id": held["lease_id"]}))
        ok(await client.call_tool("claim", {"id": todo.id}))
        return error(await client.call_tool("complete", {"id": todo.id, "lease_id": held["lease_id"]}))

    conflict = run(mcp_base, agent.token, scenario)
    assert conflict["code"] == "conflict" and conflict["state"] == "claimed"
    assert Todo.objects.get().state == TodoState.CLAIMED


@pytest.mark.parametrize(
    ("tool", "arguments", "field"),
    [
        ("claim", {"lease_seconds": "long"}, "lease_seconds"),
        ("claim", {"wait_seconds": 60}, "wait_seconds"),
        ("claim", {"id": "td_" + "0" * 32, "wait_seconds": 1}, "wait_seconds"),
        ("claim", {"colour": "red"}, "colour"),
        ("heartbeat", {"id": "td_" + "0" * 32}, "lease_id"),
        ("fail", {"id": "td_" + "0" * 32, "lease_id": "ls_x", "retry_in_seconds": -1}, "retry_in_seconds"),
        ("list_todos", {"state": "bogus"}, "state"),
        ("list_todos", {"limit": 0}, "limit"),
        ("get_todo", {}, "id"),
        ("create_for", {"title": "no queue"}, "queue"),
        ("create_for", {"queue": "jobs", "max_attempts": 3}, "max_attempts"),
        ("create_for", {"todos": [{"queue": "jobs"}, {"queue": "jobs", "priority": 500}]}, "todos.1.priority"),
        ("create_for", {"todos": [{"queue": "jobs"}], "queue": "jobs"}, "queue"),
    ],
)
def test_bad_arguments_are_invalid_naming_the_field_and_change_nothing(
    mcp_base, agent, make_todo, tool, arguments, field
):
    make_todo("jobs")

    async def scenario(client: Any) -> Any:
        return error(await client.call_tool(tool, arguments))

    refused = run(mcp_base, agent.token, scenario)
    assert refused["code"] == "invalid" and field in refused["fields"], refused
    assert Todo.objects.get().state == TodoState.PENDING
    assert Todo.objects.count() == 1


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_an_unknown_tool_is_a_json_rpc_invalid_params_error_not_a_tool_error(mcp_base, agent, mode):
    async def scenario(client: Any) -> Any:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("delete_everything", {})
        return raised.value

    refused = run(mcp_base, agent.token, scenario, mode=mode)
    assert refused.code == INVALID_PARAMS and refused.message == "Unknown tool: delete_everything"
    wire = rpc(mcp_base, agent.token, "tools/call", {"name": "delete_everything", "arguments": {}}, "2025-11-25")
    assert wire.json()["error"]["code"] == INVALID_PARAMS and "result" not in wire.json()


def test_server_info_names_the_release(mcp_base, agent):
    async def scenario(client: Any) -> Any:
        return client.server_info

    info = run(mcp_base, agent.token, scenario, mode="legacy")
    assert info.version == switchboard.__version__ and info.version


def test_a_payload_over_the_limit_is_too_large_and_creates_nothing(mcp_base, agent, settings):
    big = "x" * (settings.MAX_PAYLOAD_BYTES + 1)

    async def scenario(client: Any) -> Any:
        return error(await client.call_tool("create_for", {"queue": "jobs", "payload": {"blob": big}}))

    refused = run(mcp_base, agent.token, scenario)
    assert refused["code"] == "too_large" and "payload" in refused["fields"]
    assert not Todo.objects.exists()


# --- authentication ---------------------------------------------------------------------------


def test_no_token_is_401_pointing_at_the_protected_resource_metadata(mcp_base):
    response = rpc(mcp_base, None, "tools/list", {}, version="2025-11-25")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    challenge = response.headers["WWW-Authenticate"]
    assert challenge.startswith("Bearer ") and "error=" not in challenge
    metadata_url = challenge.split('resource_metadata="')[1].split('"')[0]
    assert metadata_url == mcp_base + "/.well-known/oauth-protected-resource/mcp"
    metadata = requests.get(metadata_url, timeout=10).json()
    assert metadata["resource"] == mcp_base + "/mcp" and metadata["bearer_methods_supported"] == ["header"]


def test_a_wrong_or_deactivated_token_is_401_invalid_token(mcp_base, agent):
    assert rpc(mcp_base, agent.token, "tools/list", {}, version="2025-11-25").status_code == 200
    wrong = rpc(mcp_base, "sb_not-a-token", "tools/list", {}, version="2025-11-25")
    assert wrong.status_code == 401 and 'error="invalid_token"' in wrong.headers["WWW-Authenticate"]
    Agent.objects.filter(pk=agent.pk).update(is_active=False)
    assert rpc(mcp_base, agent.token, "tools/list", {}, version="2025-11-25").status_code == 401


# --- hosts and origins (DNS rebinding) ----------------------------------------------------------

FORGED = "evil.example.com"


@pytest.mark.parametrize("with_token", [True, False])
def test_a_host_outside_allowed_hosts_is_400_and_never_echoed(mcp_base, agent, with_token):
    refused = rpc(mcp_base, agent.token if with_token else None, "tools/list", {}, "2025-11-25", {"Host": FORGED})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid"
    assert FORGED not in refused.text and FORGED not in str(refused.headers)
    assert requests.get(mcp_base + "/api/v1/", headers={"Host": FORGED}, timeout=10).status_code == 400  # as REST
    assert Todo.objects.count() == 0


def test_the_protected_resource_document_refuses_a_forged_host_and_names_the_real_one(mcp_base):
    url = mcp_base + "/.well-known/oauth-protected-resource/mcp"
    refused = requests.get(url, headers={"Host": FORGED}, timeout=10)
    assert refused.status_code == 400 and FORGED not in refused.text
    assert requests.get(url, headers={"Host": "localhost"}, timeout=10).json()["resource"] == "http://localhost/mcp"


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        ("http://evil.example.com", 403),  # a DNS-rebound page: its own origin, our Host
        ("null", 403),
        ("https://127.0.0.1.evil.example.com", 403),
        # Another server on a host this one answers to (the MCP Inspector's page, a dev server): another
        # origin, unless CSRF_TRUSTED_ORIGINS names it (test_security_mcp_transport.py).
        ("http://localhost:6274", 403),
        (None, 200),  # not a browser
    ],
)
def test_a_browser_origin_must_be_this_server_or_a_trusted_origin(mcp_base, agent, origin, status):
    headers = {"Origin": origin} if origin else {}
    response = rpc(mcp_base, agent.token, "tools/list", {}, "2025-11-25", headers)
    assert response.status_code == status, response.text
    if status == 403:
        assert response.json()["error"]["code"] == "forbidden"


def test_the_servers_own_origin_is_allowed_and_a_foreign_one_refused_before_the_token(mcp_base, agent):
    own = rpc(mcp_base, agent.token, "tools/list", {}, "2025-11-25", {"Origin": mcp_base})
    assert own.status_code == 200
    # The unauthenticated challenge is refused the same way for a foreign origin, before the token.
    foreign = rpc(mcp_base, None, "tools/list", {}, "2025-11-25", {"Origin": "http://evil.example.com"})
    assert foreign.status_code == 403 and "WWW-Authenticate" not in foreign.headers


# --- protocol revisions -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["legacy", *MODERN_PROTOCOL_VERSIONS, "auto"])
def test_the_official_client_works_a_todo_in_each_of_its_modes(mcp_base, agent, make_todo, mode):
    todo = make_todo("jobs")

    async def scenario(client: Any) -> Any:
        held = ok(await client.call_tool("claim", {}))["todo"]
        done = ok(await client.call_tool("complete", {"id": held["id"], "lease_id": held["lease_id"]}))
        return client.protocol_version, done

    version, done = run(mcp_base, agent.token, scenario, mode=mode)
    expected = {"legacy": HANDSHAKE_PROTOCOL_VERSIONS[-1], "auto": MODERN_PROTOCOL_VERSIONS[-1]}.get(mode, mode)
    assert version == expected
    assert done["todo"]["id"] == todo.id and done["todo"]["state"] == "done"


@pytest.mark.parametrize("version", HANDSHAKE_PROTOCOL_VERSIONS)
def test_each_handshake_revision_negotiates_and_calls_tools_over_raw_json_rpc(mcp_base, agent, make_todo, version):
    todo = make_todo("jobs")
    init = rpc(
        mcp_base,
        agent.token,
        "initialize",
        {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    )
    assert init.status_code == 200 and init.json()["result"]["protocolVersion"] == version
    called = rpc(mcp_base, agent.token, "tools/call", {"name": "claim", "arguments": {}}, version=version).json()
    result = called["result"]
    assert result["isError"] is False and json.loads(result["content"][0]["text"])["todo"]["id"] == todo.id
    if "structuredContent" in result:
        assert result["structuredContent"]["todo"]["state"] == "claimed"
    assert Todo.objects.get().state == TodoState.CLAIMED


def test_gunicorn_with_two_uvicorn_workers_serves_a_todo_across_both(agent, make_todo):
    """Stateless: each POST may land on either worker process, and a todo's life still holds together."""
    todo = make_todo("jobs")
    with live_server(GUNICORN_UVICORN) as base:

        async def scenario(client: Any) -> Any:
            held = ok(await client.call_tool("claim", {}))["todo"]
            for _ in range(6):
                ok(await client.call_tool("heartbeat", {"id": held["id"], "lease_id": held["lease_id"]}))
            return ok(await client.call_tool("complete", {"id": held["id"], "lease_id": held["lease_id"]}))

        done = run(base, agent.token, scenario, mode="legacy")
    assert done["todo"]["id"] == todo.id and done["todo"]["state"] == "done"
