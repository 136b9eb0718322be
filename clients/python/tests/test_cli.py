"""The `switchboard` CLI against the shipped server: every command's output, --json, and exit codes
(0 ok, 1 error, 2 usage, 3 not found, 4 conflict), with clear words for a wrong token and a down server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from events.models import Event
from ingest.models import Route, Source
from todos import queue
from todos.models import Todo, TodoState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def sb(env):
    def run(*args: str, code: int = 0, **extra_env: str) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "-m", "switchboard_client", *args],
            env={**env, **extra_env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == code, (result.stdout, result.stderr)
        return result

    return run


def test_todos_create_list_get_cancel(sb):
    out = sb("todos", "create", "cli.q", "--kind", "review", "--title", "Review it", "--payload", '{"pr": 7}').stdout
    assert out.startswith("created td_") and "(pending) in cli.q" in out
    created = json.loads(sb("todos", "create", "cli.q", "--key", "k1", "--priority", "-3", "--json").stdout)
    assert created["created"] is True and created["priority"] == -3
    again = json.loads(sb("todos", "create", "cli.q", "--key", "k1", "--json").stdout)
    assert again["id"] == created["id"] and again["created"] is False

    table = sb("todos", "list", "--queue", "cli.q").stdout.splitlines()
    assert table[0].split() == ["ID", "QUEUE", "KIND", "STATE", "ATTEMPT", "PRI", "TITLE", "CREATED"]
    assert len(table) == 3 and "Review it" in table[2]
    rows = json.loads(sb("todos", "list", "--queue", "cli.q", "--limit", "1", "--json").stdout)
    assert [r["id"] for r in rows] == [created["id"]]

    lines = sb("todos", "get", created["id"]).stdout.splitlines()
    detail = dict((*line.split(maxsplit=1), "")[:2] for line in lines)
    assert detail["id"] == created["id"] and detail["state"] == "pending" and detail["priority"] == "-3"
    assert json.loads(sb("todos", "get", created["id"], "--json").stdout)["queue"] == "cli.q"

    assert sb("todos", "cancel", created["id"], "--reason", "dup").stdout.strip() == f"cancelled {created['id']}"
    conflict = sb("todos", "cancel", created["id"], code=4)
    assert "conflict" in conflict.stderr and "state: cancelled" in conflict.stderr
    missing = sb("todos", "get", "td_nope", code=3)
    assert missing.stderr.startswith("switchboard: not found")


def test_claim_complete_fail_release_for_shell_scripts(sb):
    queue.create(queue="sh", payload={"n": 1})
    [todo] = json.loads(sb("claim", "--queue", "sh", "--lease", "30", "--worker", "sh1", "--json").stdout)
    assert todo["owner"] == "alice/sh1"
    out = sb("complete", todo["id"], "--lease", todo["lease_id"], "--result", '{"ok": true}').stdout
    assert out.strip() == f"{todo['id']} done"
    assert sb("complete", todo["id"], "--lease", todo["lease_id"], code=4).stderr.count("state: done") == 1
    assert Todo.objects.get(pk=todo["id"]).result == {"ok": True}

    queue.create(queue="sh", kind="k", max_attempts=1)
    table = sb("claim", "--queue", "sh", "--wait", "2").stdout.splitlines()
    assert table[0].split() == ["ID", "QUEUE", "KIND", "STATE", "LEASE", "EXPIRES"]
    todo_id, lease = table[1].split()[0], table[1].split()[4]
    assert sb("fail", todo_id, "--lease", lease, "--error", "boom").stdout.strip() == f"{todo_id} dead-letter"
    queue.create(queue="sh")
    [todo] = json.loads(sb("claim", "--queue", "sh", "--json").stdout)
    assert sb("release", todo["id"], "--lease", todo["lease_id"]).stdout.strip() == f"{todo['id']} pending"
    assert sb("claim", "--queue", "empty", "--json").stdout.strip() == "[]"


def test_heartbeat_wait_resolve_and_waitpoints_resolve_for_shell_scripts(sb, make_agent):
    queue.create(queue="shw")
    # An event wait names a source routed into the agent's scopes; a resolver other than the waiter.
    Route.objects.create(source=Source.objects.create(slug="github", provider="github", secret="s"), queue="shw")
    reviewer = make_agent("reviewer")
    [todo] = json.loads(sb("claim", "--queue", "shw", "--json").stdout)
    beat = sb("heartbeat", todo["id"], "--lease", todo["lease_id"], "--percent", "30", "--message", "a third")
    assert beat.stdout.strip() == f"{todo['id']} claimed"
    sb("heartbeat", todo["id"], "--lease", todo["lease_id"], "--checkpoint", '{"step": 2}')
    row = Todo.objects.get(pk=todo["id"])
    assert row.progress["percent"] == 30 and row.checkpoint == {"step": 2}

    out = sb("todos", "wait", todo["id"], "--lease", todo["lease_id"], "--for-token", "--timeout", "600").stdout
    first, token_line, url_line = out.splitlines()
    assert first == f'{todo["id"]} waiting for {{"token": true}}' and url_line.startswith("resolve_url http")
    token = token_line.removeprefix("token ")
    assert sb("waitpoints", "resolve", token, "--data", '{"ok": 1}', SWITCHBOARD_TOKEN="").stdout.strip() == "resolved"
    assert "resolved already" in sb("waitpoints", "resolve", token, code=4).stderr
    assert Todo.objects.get(pk=todo["id"]).resolution["data"] == {"ok": 1}

    [todo] = json.loads(sb("claim", "--queue", "shw", "--json").stdout)
    event = '{"source": "github", "type": "push", "match": {"ref": "main"}}'
    args = ("todos", "wait", todo["id"], "--lease", todo["lease_id"], "--for-event", event, "--timeout", "60")
    waiting = json.loads(sb(*args, "--on-timeout", "fail", "--resolver", "reviewer", "--json").stdout)
    assert waiting["state"] == "waiting" and waiting["waiting_for"]["event"]["type"] == "push"
    assert "forbidden" in sb("todos", "resolve", todo["id"], code=1).stderr  # never the waiting agent itself
    as_reviewer = {"SWITCHBOARD_TOKEN": reviewer.token}
    resolved = sb("todos", "resolve", todo["id"], "--data", "7", **as_reviewer).stdout.strip()
    assert resolved == f"resolved {todo['id']} (pending)"
    assert sb("todos", "resolve", todo["id"], code=4, **as_reviewer).stderr.count("state: pending") == 1
    assert sb("todos", "wait", "td_x", "--lease", "ls_x", "--timeout", "5", code=2).stderr  # no --for-*

    [todo] = json.loads(sb("claim", "--queue", "shw", "--json").stdout)
    sb("complete", todo["id"], "--lease", todo["lease_id"], "--result", '{"n": 5}')
    assert json.loads(sb("todos", "get", todo["id"], "--wait", "5", "--json").stdout)["result"] == {"n": 5}


def test_todos_retry_revives_a_dead_letter(sb, make_agent):
    ops = make_agent("ops", can_retry_dead_letters=True)
    todo = queue.create(queue="dl", max_attempts=1)[0]
    Todo.objects.filter(pk=todo.pk).update(state=TodoState.FAILED, attempt=1)
    out = sb("todos", "retry", todo.pk, "--mode", "once", "--note", "fixed", SWITCHBOARD_TOKEN=ops.token).stdout
    assert out.strip() == f"retrying {todo.pk} (pending)"
    # alice may not retry dead-letters: 403 is an error (1).
    assert "forbidden" in sb("todos", "retry", todo.pk, code=1).stderr


def test_queues_list_pause_resume_limits(sb, make_agent):
    manager = make_agent("manager", can_manage_queues=True)
    queue.create(queue="ops.q")
    table = sb("queues", "list").stdout.splitlines()
    assert table[0].split()[:3] == ["QUEUE", "PENDING", "CLAIMED"]
    assert table[1].split()[:2] == ["ops.q", "1"]
    as_manager = {"SWITCHBOARD_TOKEN": manager.token}
    assert json.loads(sb("queues", "pause", "ops.q", "--json", **as_manager).stdout)["paused"] is True
    assert "no" in sb("queues", "resume", "ops.q", **as_manager).stdout.splitlines()[1]
    limits = json.loads(
        sb("queues", "limits", "ops.q", "--max-claimed", "3", "--rate", "2.5", "--json", **as_manager).stdout
    )
    assert (limits["max_claimed"], limits["rate_per_second"]) == (3, 2.5)
    shown = sb("queues", "limits", "ops.q", "--max-claimed", "none", **as_manager).stdout.splitlines()
    assert shown[0].split() == ["QUEUE", "PAUSED", "MAX_CLAIMED", "RATE", "BURST", "FAIR", "PER_KEY"]
    assert shown[1].split()[:4] == ["ops.q", "no", "-", "2.5"]
    fair = ("--fair", "--weight", "acme/api=2", "--weight", "b=0.5", "--max-claimed-per-key", "2", "--json")
    controls = json.loads(sb("queues", "limits", "ops.q", *fair, **as_manager).stdout)
    assert controls["fair"] is True and controls["max_claimed_per_key"] == 2
    assert controls["fair_weights"] == {"acme/api": 2.0, "b": 0.5}
    assert sb("queues", "limits", "ops.q", "--weight", "noweight", code=2).stderr
    created = json.loads(sb("todos", "create", "ops.q", "--fair-key", "acme/api", "--json").stdout)
    assert created["fair_key"] == "acme/api"
    listed = json.loads(sb("todos", "list", "--fair-key", "acme/api", "--json").stdout)
    assert [t["id"] for t in listed] == [created["id"]]
    after = sb("todos", "create", "ops.q", "--depends-on", created["id"], "--on-dependency-failure", "run").stdout
    assert after.startswith("created td_") and "(waiting)" in after
    assert "forbidden" in sb("queues", "pause", "ops.q", code=1).stderr  # alice cannot manage queues
    assert sb("queues", "pause", "nope", code=3, **as_manager).stderr.startswith("switchboard: not found")


def test_events_list_get_replay(sb):
    source = Source.objects.create(slug="gh", provider="github", secret="s")
    Route.objects.create(source=source, event_pattern="*", queue="ev")
    event = Event.objects.create(source="gh", type="push", delivery_id="d1", payload={"a": 1})
    table = sb("events", "list", "--source", "gh").stdout.splitlines()
    assert table[0].split() == ["ID", "SOURCE", "TYPE", "DELIVERY", "RECEIVED"]
    assert table[1].split()[:4] == [event.id, "gh", "push", "d1"]
    assert json.loads(sb("events", "get", event.id, "--json").stdout)["payload"] == {"a": 1}
    assert sb("events", "replay", event.id).stdout.strip() == f"replayed {event.id}: 1 todo(s), 1 new"
    assert Todo.objects.filter(event_id=event.id, queue="ev").count() == 1


def test_worker_runs_handlers_from_a_module(sb, env, tmp_path):
    (tmp_path / "cli_handlers.py").write_text("handlers = {'echo': lambda todo: todo.payload}\n")
    ids = [queue.create(queue="wq", kind="echo", payload={"n": i})[0].id for i in range(5)]
    out = subprocess.run(
        [sys.executable, "-m", "switchboard_client", "worker", "cli_handlers", "--queues", "wq", "--drain", "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["completed"] == 5
    assert [t.result for t in Todo.objects.filter(pk__in=ids).order_by("created_at")] == [{"n": i} for i in range(5)]
    assert "cannot import 'nowhere'" in sb("worker", "nowhere", code=2).stderr


def test_watch_prints_live_queue_counts(sb):
    queue.create(queue="watched")
    out = sb("watch", "--count", "2", "--interval", "0.1", "--queue", "watch").stdout
    assert out.count("QUEUE") == 2 and out.count("watched") == 2
    ticks = [json.loads(line) for line in sb("watch", "--count", "1", "--json").stdout.splitlines()]
    assert [q["pending"] for q in ticks[0]["queues"] if q["queue"] == "watched"] == [1]


def test_clear_messages_for_a_wrong_token_a_down_server_and_a_bad_argument(sb):
    wrong = sb("queues", "list", code=1, SWITCHBOARD_TOKEN="sb_wrong")
    assert "refused the token (401)" in wrong.stderr and "SWITCHBOARD_TOKEN" in wrong.stderr
    none = sb("queues", "list", code=1, SWITCHBOARD_TOKEN="")
    assert "no token" in none.stderr
    down = sb("queues", "list", "--url", "http://127.0.0.1:9", code=1)
    assert "cannot reach the server at http://127.0.0.1:9: is it running?" in down.stderr
    assert "invalid choice" in sb("todos", "list", "--state", "bogus", code=2).stderr
    assert "not JSON" in sb("todos", "create", "q", "--payload", "{nope", code=2).stderr
    invalid = sb("todos", "create", "q", "--priority", "500", code=2)
    assert "invalid" in invalid.stderr and "priority" in invalid.stderr
    as_json = json.loads(sb("todos", "get", "td_nope", "--json", code=3).stderr)
    assert as_json["error"]["code"] == "not_found"
    assert sb("--help").stdout.startswith("usage: switchboard")
