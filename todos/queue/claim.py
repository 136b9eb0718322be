"""Claiming: the next todos of the caller's queues (plain, then fair share), or one by id
(todos/sql/claim.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from django.db import connection

from todos import selectors, sql, tracing
from todos.errors import InvalidTransitionInput, QueuesForbidden
from todos.limits import KEYED_SCOPES_MEMO_MAX, KEYED_SCOPES_MEMO_SECONDS, MAX_CLAIM_BATCH, fair_reserve
from todos.metrics import FAIR_READY_CLAIMS, count_lapsed_claims, counted
from todos.models import ALL_QUEUES, Agent, Todo, glob_to_like
from todos.queue._common import lease_for, one, owner
from todos.rows import fetch_todos

# A claim's (claim scopes as LIKE patterns, wanted queues): what the memos below remember, per process.
_Scopes = tuple[tuple[str, ...], tuple[str, ...]]

# The (claim scopes, queues) whose last claim found a keyed queue eligible (CLAIM_NEXT answered its row of NULLs),
# and when (time.monotonic()). For KEYED_SCOPES_MEMO_SECONDS their claims run CLAIM_NEXT_FAIR at once: asking
# CLAIM_NEXT first cost every fair claim a second statement (~0.3 ms, a sixth of a fair claim and complete), which
# at 16 claimers on 2 cores was 307 / 291 / 516 against 527 / 386 / 559 jobs/s without it (docs/benchmarks.md).
# Either answer is right whatever changed meanwhile: CLAIM_NEXT_FAIR claims from plain queues too (slower), and a
# queue made fair is found by the next probe. Per process; bounded (KEYED_SCOPES_MEMO_MAX), then forgotten.
_keyed_scopes: dict[_Scopes, float] = {}
# The same for a limited queue (issue 32): CLAIM_NEXT's row of NULLs marked 'limited' (a queue with max_claimed or
# a rate, and no keyed or flow one, among the caller's); their claims run CLAIM_NEXT_LIMITED at once. Either answer
# stays right: CLAIM_NEXT_LIMITED claims from plain queues too, and hands a keyed or flow one to CLAIM_NEXT_FAIR.
_limited_scopes: dict[_Scopes, float] = {}
# The (scopes, queues) whose last fair turn reserved todos or found some reserved (its row of NULLs marked
# 'reserved'), or whose last fast claim (CLAIM_FAIR_READY) took some or found some left (issue 31, reservations):
# their claims run the fast claim first, and the fair turn only for what it did not fill. Forgotten when a fast
# claim finds none at all. Per process; a fair turn's answer short of the limit always tries the fast claim too,
# so no reserved todo waits on a process remembering it.
_ready_scopes: dict[_Scopes, float] = {}


def _remembered(memo: dict[_Scopes, float], key: _Scopes) -> bool:
    seen = memo.get(key)
    return seen is not None and time.monotonic() - seen < KEYED_SCOPES_MEMO_SECONDS


def _remember(memo: dict[_Scopes, float], key: _Scopes) -> None:
    if len(memo) >= KEYED_SCOPES_MEMO_MAX:
        memo.clear()
    memo[key] = time.monotonic()


def forget_keyed_scopes() -> None:
    """Forget every remembered (scopes, queues): tests start from a claim that asks CLAIM_NEXT first."""
    _keyed_scopes.clear()
    _limited_scopes.clear()
    _ready_scopes.clear()


def _claim_fair(params: dict[str, object]) -> tuple[list[Todo], bool]:
    """CLAIM_NEXT_FAIR, which turns synchronous_commit off for its transaction (todos/sql/claim.py: a fair
    claimer's turn must not include its flush). Inside a caller's atomic block that transaction is the
    caller's, so the setting goes back to the default at once: it must not cover the caller's other writes.
    Answers the todos claimed and whether the turn reserved (its row of NULLs marked 'reserved', stripped)."""
    rows = fetch_todos(sql.CLAIM_NEXT_FAIR, params)
    if connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO DEFAULT")
    todos = [t for t in rows if t.id is not None]
    return todos, len(todos) < len(rows)


def _claim_ready(params: dict[str, object], memo: _Scopes) -> list[Todo]:
    """CLAIM_FAIR_READY: reserved todos, without the queue's lock. Remembers that there are some (it took some,
    or its row of NULLs says some remain: a more urgent todo went first), or forgets it."""
    rows = fetch_todos(sql.CLAIM_FAIR_READY, params)
    todos = [t for t in rows if t.id is not None]
    if rows:
        FAIR_READY_CLAIMS.inc(len(todos))
        _remember(_ready_scopes, memo)
    else:
        _ready_scopes.pop(memo, None)
    return todos


def _claim_keyed(params: dict[str, object], memo: _Scopes, limit: int) -> list[Todo]:
    """A claim with a keyed queue among the caller's: reserved todos first when this process last saw some, the
    fair turn for the rest, and reserved todos again when the turn answered short (one a dead process reserved,
    or one reserved by a claimer that turned while this one waited)."""
    todos: list[Todo] = []
    if _remembered(_ready_scopes, memo):
        todos = _claim_ready(params, memo)
    if len(todos) < limit:
        fair, reserved = _claim_fair({**params, "limit": limit - len(todos)})
        todos += fair
        if reserved:
            _remember(_ready_scopes, memo)
        if len(todos) < limit:
            todos += _claim_ready({**params, "limit": limit - len(todos)}, memo)
    return todos


@counted("claim_next", lambda todos: "ok" if todos else "empty")
@tracing.traced("claim")
def claim_next(
    *,
    agent: Agent,
    queues: Sequence[str] | None = None,
    limit: int = 1,
    lease_seconds: float | None = None,
    worker: str | None = None,
) -> list[Todo]:
    """pending (or lapsed, retry-due, scheduled and due) -> claimed, up to ``limit`` todos, by priority
    (lower first), then run_at.

    ``queues`` (names or globs) narrows the agent's claim scopes; it never widens them.
    """
    if not 1 <= limit <= MAX_CLAIM_BATCH:
        raise InvalidTransitionInput(f"limit must be between 1 and {MAX_CLAIM_BATCH}.", field="limit")
    if queues and (outside := agent.outside_claim_scopes(queues)):
        raise QueuesForbidden(outside)
    scopes = agent.claim_like_patterns()
    wanted = [glob_to_like(q) for q in queues] if queues else ALL_QUEUES
    params = {
        "scopes": scopes,
        "wanted": wanted,
        "agent": agent.name,
        "owner": owner(agent, worker),
        "limit": limit,
        "lease_seconds": lease_for(lease_seconds),
        # FAIR_RESERVE rounded up to whole batches of this size: claimers taking batches of one size then take
        # reservations in whole batches, each the same spread of tags as a turn's (3 busy keys, limit 9: 3 each)
        "reserve": -(-fair_reserve() // limit) * limit,
    }
    memo = (tuple(scopes), tuple(wanted))
    if _remembered(_keyed_scopes, memo):
        todos = _claim_keyed(params, memo, limit)
    else:
        limited = _remembered(_limited_scopes, memo)
        todos = fetch_todos(sql.CLAIM_NEXT_LIMITED if limited else sql.CLAIM_NEXT, params)
        if not limited and todos and todos[0].id is None and todos[0].kind == "limited":
            # Only limited queues (max_claimed, a rate) and plain ones among the caller's (issue 32).
            _remember(_limited_scopes, memo)
            todos = fetch_todos(sql.CLAIM_NEXT_LIMITED, params)
        if todos and todos[0].id is None:  # a keyed queue is among the caller's: it took nothing (fair share)
            _remember(_keyed_scopes, memo)
            todos = _claim_keyed(params, memo, limit)
    todos.sort(key=lambda t: (t.priority, t.run_at))  # UPDATE ... RETURNING keeps no order (CLAIM_ORDER)
    count_lapsed_claims(todos)
    selectors.attach_dependencies(todos)  # a merge step reads its dependencies' results from its claim
    selectors.show_awaited(todos)
    return todos


@counted("claim")
@tracing.traced("claim")
def claim(todo_id: str, *, agent: Agent, lease_seconds: float | None = None, worker: str | None = None) -> Todo:
    """pending (or lapsed, retry-due, scheduled and due) -> claimed, for this one todo."""
    rows = fetch_todos(
        sql.CLAIM_ONE,
        {
            "id": todo_id,
            "scopes": agent.claim_like_patterns(),
            "agent": agent.name,
            "owner": owner(agent, worker),
            "limit": 1,
            "lease_seconds": lease_for(lease_seconds),
        },
    )
    count_lapsed_claims(rows)
    selectors.attach_dependencies(rows)
    selectors.show_awaited(rows)
    return one(rows, todo_id, agent, "claim")
