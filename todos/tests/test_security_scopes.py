"""Issue 28, scopes: a compromised agent's patterns are data, never code (H1); its glob create scope
cannot mint unbounded queues (M4); fair_weights is bounded (L7). Each test attacks as such an agent would."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import threading
from datetime import timedelta
from typing import Any

import pytest
import requests
from django.core.exceptions import ValidationError
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.http.aio_http import Connection
from todos.globs import collapse_stars, compile_glob, wildcards
from todos.limits import MAX_FAIR_WEIGHTS_KEYS, MAX_SCOPE_WILDCARDS
from todos.models import Agent, Queue, Todo, TodoState, validate_scope
from todos.tests.mcp_live import mcp_base

__all__ = ["mcp_base"]  # the fixture, imported for pytest

CLAIM = "/api/v1/todos/claim/"
# 199 stars and a letter the scope never holds: as a backtracking regex, about 10^14 steps against the
# scope github.* (security-review H1). The old scope check never answered it.
STARS = "*" * 199 + "x"
ATTACK_SECONDS = 15  # the answer comes in milliseconds; before the fix it never came


# --- the matcher ----------------------------------------------------------------------------------

_GLOBS = st.text(alphabet="ab.*?", max_size=12)
_NAMES = st.text(alphabet="ab.*?", max_size=14)


@settings(max_examples=3000, deadline=None)
@given(pattern=_GLOBS, name=_NAMES)
def test_the_matcher_agrees_with_fnmatch(pattern, name):
    # fnmatch's * and ? are the scopes' (no [ ] is allowed in a scope), and it reads * and ? in the
    # name as plain characters, as outside_claim_scopes reads a glob as a name.
    assert compile_glob(pattern).matches(name) == fnmatch.fnmatchcase(name, pattern)


@settings(max_examples=300, deadline=None)
@given(pattern=_GLOBS)
def test_collapsing_stars_keeps_the_meaning_and_counts_each_run_once(pattern):
    collapsed = collapse_stars(pattern)
    assert "**" not in collapsed
    for name in ("", "a", "ab", "a.b", "ba.ab", "aaab"):
        assert fnmatch.fnmatchcase(name, collapsed) == fnmatch.fnmatchcase(name, pattern)
    assert wildcards(pattern) == collapsed.count("*") + collapsed.count("?")


def test_hostile_globs_are_matched_in_linear_time():
    # Each of these is exponential or far worse for a backtracking regex of .* groups.
    scope = "github." + "a" * 190
    for pattern in (STARS, "*a" * 99 + "x", "a*" * 8 + "b", "*?" * 99 + "x", "?" * 199 + "*"):
        assert not compile_glob(pattern).matches(scope)
    assert compile_glob("*a" * 99).matches("a" * 199)


def test_a_scope_with_more_than_the_wildcard_limit_is_refused_naming_the_limit():
    validate_scope("*." + "?." * (MAX_SCOPE_WILDCARDS - 1))
    validate_scope("jobs." + "*" * 50)  # one run of stars is one wildcard
    with pytest.raises(ValidationError, match=f"at most {MAX_SCOPE_WILDCARDS} wildcards"):
        validate_scope("*." * (MAX_SCOPE_WILDCARDS + 1))


def test_outside_claim_scopes_reads_globs_as_data():
    agent = Agent(name="a", claim_scopes=["github.*", "jobs"])
    assert agent.outside_claim_scopes([STARS, "github.pulls", "github.*", "*", "jobs", "jo?s", "mail"]) == [
        STARS,
        "mail",
    ]


# --- the claim over REST (the Procfile's server) and MCP ------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_199_star_claim_is_refused_at_once_and_the_process_keeps_serving(start_server, make_agent):
    agent = make_agent("intruder", claim=["github.*"])
    server = start_server(workers=2)

    async def attack() -> None:
        # More hostile claims than the server has processes, a long-poll among them, all in flight at once.
        attackers = [await Connection(server.base, agent.token).open() for _ in range(4)]
        health = await Connection(server.base).open()
        try:
            for n, attacker in enumerate(attackers):
                await attacker.send("POST", CLAIM, {"queues": [STARS], **({"wait_seconds": 5} if n % 2 else {})})
            status, _ = await asyncio.wait_for(health.request("GET", "/healthz"), ATTACK_SECONDS)
            assert status == 200
            for attacker in attackers:
                status, body = await asyncio.wait_for(attacker.answer(), ATTACK_SECONDS)
                assert status == 403, body
                assert body["error"]["code"] == "forbidden" and body["error"]["queues"] == ["*x"]
            # A glob with too many wildcards to collapse is a 400 naming the field.
            status, body = await asyncio.wait_for(
                attackers[0].request("POST", CLAIM, {"queues": ["*?" * 99 + "x"]}), ATTACK_SECONDS
            )
            assert status == 400 and "queues" in body["error"]["fields"], body
        finally:
            for connection in [*attackers, health]:
                writer = connection.writer
                connection.close()
                if writer is not None:
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()

    asyncio.run(attack())


@pytest.mark.django_db(transaction=True)
def test_a_199_star_claim_over_mcp_is_refused_at_once(mcp_base, make_agent):
    agent = make_agent("intruder", claim=["github.*"])

    def call(args: dict[str, Any]) -> dict[str, Any]:
        response = requests.post(
            mcp_base + "/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "claim", "arguments": args}},
            headers={
                "Accept": "application/json, text/event-stream",
                "Authorization": f"Bearer {agent.token}",
                "MCP-Protocol-Version": "2025-11-25",
            },
            timeout=ATTACK_SECONDS,
        )
        result = response.json()["result"]
        assert result["isError"], result
        return dict(json.loads(result["content"][0]["text"])["error"])

    refused = call({"queues": [STARS]})
    assert refused["code"] == "forbidden" and refused["queues"] == ["*x"]
    too_wild = call({"queues": ["?" * (MAX_SCOPE_WILDCARDS + 1)]})
    assert too_wild["code"] == "invalid" and "queues" in too_wild["fields"]
    assert requests.get(mcp_base + "/healthz", timeout=ATTACK_SECONDS).status_code == 200


# --- fair_weights (L7) ----------------------------------------------------------------------------


@pytest.fixture
def manager(make_agent, api_for):
    # An agent that may manage its queues: fair_weights is one of its controls.
    return api_for(make_agent("ops", claim=["jobs*"], create=["jobs*"], can_manage_queues=True))


def _patch_queue(api, name, body):
    return api.client.patch(f"/api/v1/queues/{name}/", data=json.dumps(body), content_type="application/json")


@pytest.mark.parametrize(
    "weights",
    [
        {f"tenant-{n}": 2 for n in range(MAX_FAIR_WEIGHTS_KEYS + 1)},  # a Sybil key list every claim reads
        {"acme\x00": 2},  # NUL: jsonb cannot store it (was a 500)
        {"acme\ud800": 2},  # a lone surrogate: UTF-8 cannot encode it (was a 500)
        {"acme": 1e300},
    ],
    ids=["too-many-keys", "nul", "surrogate", "huge"],
)
def test_fair_weights_over_the_bounds_are_400_naming_the_field_and_change_nothing(manager, weights):
    manager.post("/todos/", {"queue": "jobs"})
    response = _patch_queue(manager, "jobs", {"fair_weights": weights})
    assert response.status_code == 400, response.content
    assert "fair_weights" in response.json()["error"]["fields"]
    assert Queue.objects.get(name="jobs").fair_weights == {}


def test_fair_weights_at_the_key_limit_are_taken(manager):
    manager.post("/todos/", {"queue": "jobs"})
    weights = {f"tenant-{n}": 2 for n in range(MAX_FAIR_WEIGHTS_KEYS)}
    response = _patch_queue(manager, "jobs", {"fair_weights": weights})
    assert response.status_code == 200, response.content
    assert len(Queue.objects.get(name="jobs").fair_weights) == MAX_FAIR_WEIGHTS_KEYS


# --- queues per create scope (M4) -----------------------------------------------------------------

LIMIT = 3


@pytest.fixture
def few_queues(settings):
    settings.MAX_QUEUES_PER_CREATE_SCOPE = LIMIT


@pytest.fixture
def minter(make_agent, api_for):
    # A compromised producer: its glob create scope lets it name any queue under jobs.
    return api_for(make_agent("minter", claim=["jobs.*"], create=["jobs.*", "jobs.exact"]))


def _queues() -> set[str]:
    return set(Queue.objects.values_list("name", flat=True))


def test_a_glob_create_scope_adds_no_queue_past_its_limit_and_writes_nothing(few_queues, minter):
    for n in range(LIMIT):
        assert minter.post("/todos/", {"queue": f"jobs.{n}"}).status_code == 201
    response = minter.post("/todos/", {"queue": "jobs.one-too-many"})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["limit"], error["scope"]) == ("queue_limit", LIMIT, "jobs.*")
    assert "queue" in error["fields"]
    assert _queues() == {f"jobs.{n}" for n in range(LIMIT)} and Todo.objects.count() == LIMIT
    # Existing queues always work, and so does an exact-name scope.
    assert minter.post("/todos/", {"queue": "jobs.0"}).status_code == 201
    assert minter.post("/todos/", {"queue": "jobs.exact"}).status_code == 201


def test_a_batch_that_would_pass_the_limit_is_refused_whole_naming_the_item(few_queues, minter):
    minter.post("/todos/", {"queue": "jobs.0"})
    items = [{"queue": "jobs.0"}, *({"queue": f"jobs.new-{n}"} for n in range(LIMIT))]
    response = minter.post("/todos/batch/", {"todos": items})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "queue_limit" and "todos.1.queue" in error["fields"], error
    assert _queues() == {"jobs.0"} and Todo.objects.count() == 1
    # Up to the limit, a batch adds its queues: jobs.0 and LIMIT - 1 new ones.
    response = minter.post("/todos/batch/", {"todos": items[:LIMIT]})
    assert response.status_code == 200, response.content
    assert len(_queues()) == LIMIT


@pytest.mark.django_db(transaction=True)  # the tool runs its statements on another thread's connection
def test_create_for_over_mcp_is_limited_the_same(few_queues, make_agent):
    from todos.mcp import tools

    agent = make_agent("minter", claim=["jobs.*"], create=["jobs.*"])
    for n in range(LIMIT):
        assert not asyncio.run(tools.call("create_for", agent, {"queue": f"jobs.{n}"})).is_error
    for arguments in ({"queue": "jobs.x"}, {"todos": [{"queue": "jobs.y"}]}):
        result = asyncio.run(tools.call("create_for", agent, arguments))
        assert result.is_error and json.loads(result.content[0].text)["error"]["code"] == "queue_limit"
    assert len(_queues()) == LIMIT


def test_staff_and_the_system_are_not_limited(few_queues, make_agent):
    from django.contrib.auth import get_user_model

    from todos import queue
    from todos.auth import staff_agent

    make_agent("minter", claim=["jobs.*"])
    for n in range(LIMIT + 2):
        queue.create(queue=f"jobs.route-{n}")  # a route or a schedule (no agent)
    admin = get_user_model().objects.create_superuser("admin", "admin@example.com", "x")
    queue.create(queue="jobs.by-staff", agent=staff_agent(admin))
    assert len(_queues()) == LIMIT + 3


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_under_one_glob_stop_exactly_at_the_limit(few_queues, make_agent):
    from django.db import connection

    from todos import queue
    from todos.errors import QueueLimitReached

    agent = make_agent("minter", claim=["jobs.*"], create=["jobs.*"])
    threads = 8
    barrier = threading.Barrier(threads)
    outcomes: list[str] = []

    def mint(n: int) -> None:
        try:
            barrier.wait()
            queue.create(queue=f"jobs.racer-{n}", agent=agent)
            outcomes.append("created")
        except QueueLimitReached:
            outcomes.append("refused")
        finally:
            connection.close()

    workers = [threading.Thread(target=mint, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sorted(outcomes) == ["created"] * LIMIT + ["refused"] * (threads - LIMIT)
    assert len(_queues()) == LIMIT


# --- retention prunes the queues a glob scope left behind (M4) -------------------------------------


def _registered(name: str, days_old: float = 10, **controls: Any) -> None:
    """A queue row as the registry trigger leaves it, ``days_old`` days ago, with these controls."""
    from django.db.models.functions import Now

    Queue.objects.update_or_create(name=name, defaults=controls)
    Queue.objects.filter(name=name).update(created_at=Now() - timedelta(days=days_old))


def test_purge_prunes_the_queues_left_with_no_work_and_no_controls(make_todo):
    from todos import retention

    for name in ("jobs.spent", "jobs.done-only", "jobs.cancelled-only"):
        _registered(name)
    make_todo("jobs.done-only", state=TodoState.DONE)
    make_todo("jobs.cancelled-only", state=TodoState.CANCELLED)
    from django.db.models.functions import Now

    kept: dict[str, dict[str, Any]] = {
        "jobs.pending": {},
        "jobs.scheduled": {"delay_seconds": 3600},
        "jobs.claimed": {"state": TodoState.CLAIMED},
        "jobs.waiting": {"state": TodoState.WAITING, "waiting_for": {"manual": True}},
        "jobs.retrying": {"state": TodoState.FAILED, "attempt": 1, "next_retry_at": Now() + timedelta(hours=1)},
        "jobs.dead": {"state": TodoState.FAILED, "attempt": 5},
    }
    for name, shape in kept.items():
        _registered(name)
        make_todo(name, **shape)
    _registered("jobs.paused", paused=True)
    _registered("jobs.capped", max_claimed=2)
    _registered("jobs.weighted", fair_weights={"acme": 2})
    _registered("jobs.fair", fair=True)
    _registered("jobs.fresh", days_old=1)  # registered within the done window

    assert retention.purge(dry_run=True).queues == 3
    assert retention.purge(batch=2).queues == 3
    assert _queues() == {*kept, "jobs.paused", "jobs.capped", "jobs.weighted", "jobs.fair", "jobs.fresh"}
    # The name is free to use again: a create registers it, and a claim by glob finds the todo.
    todo = make_todo("jobs.spent")
    claimer = Agent.objects.create(name="claimer", claim_scopes=["jobs.sp*"])
    from todos import queue

    assert [t.id for t in queue.claim_next(agent=claimer)] == [todo.id]


@pytest.mark.django_db(transaction=True)
def test_purge_never_prunes_a_queue_a_create_is_writing_to(make_agent):
    from django.db import connection, transaction

    from todos import queue, retention

    agent = make_agent("producer", claim=["jobs.*"], create=["jobs.*"])
    _registered("jobs.spent")
    inserted, committed = threading.Event(), threading.Event()
    made: list[str] = []

    def create_and_hold() -> None:
        try:
            with transaction.atomic():
                made.append(queue.create(queue="jobs.spent", agent=agent)[0].id)
                inserted.set()  # the todo is written, not yet committed: a purge cannot see it
                committed.wait(30)
        finally:
            connection.close()

    writer = threading.Thread(target=create_and_hold)
    writer.start()
    assert inserted.wait(30)
    try:
        retention.purge()
    finally:
        committed.set()
        writer.join()
    assert "jobs.spent" in _queues()
    assert [t.id for t in queue.claim_next(agent=agent, queues=["jobs.*"])] == made


def test_claims_naming_ever_new_queue_filters_keep_the_fair_scopes_memo_bounded(agent, make_todo):
    """Issue 31's cost bar: each process remembers the (scopes, queues) whose claims found a fair queue
    (todos/queue/claim.py). The queues filter is the caller's own text: a compromised token sending a new glob
    on every claim must not grow that memo without bound (KEYED_SCOPES_MEMO_MAX, then forgotten at once)."""
    from todos import controls, queue
    from todos.limits import KEYED_SCOPES_MEMO_MAX
    from todos.queue.claim import _keyed_scopes as memo

    make_todo("alpha")
    controls.set_limits("alpha", fair=True)
    for i in range(KEYED_SCOPES_MEMO_MAX + 5):
        queue.claim_next(agent=agent, queues=["alpha", f"alpha.{i}"])
    assert 0 < len(memo) <= KEYED_SCOPES_MEMO_MAX
