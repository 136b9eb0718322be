"""Why isn't it running (issue 30, item 6): every reason one todo is not being claimed now, in order, and why an
agent's claim got nothing. Reads only; each reason is computed from the claim's own predicates
(todos/sql/explain.py), scoped like every read (404 outside the caller's scopes)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from todos import sql, states
from todos.errors import TodoNotFound
from todos.models import Agent, TodoState, glob_to_like, visible_patterns
from todos.rows import fetchall
from todos.sql.explain import EXPLAIN_AGENT, EXPLAIN_TODO

# At most this many queues one agent's explain reports (its scopes may cover thousands).
MAX_EXPLAINED_QUEUES = 50

Reason = dict[str, Any]


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _state_reasons(r: dict[str, Any]) -> list[Reason]:
    """Why its state keeps it from a claim (nothing when CLAIMABLE holds)."""
    if r["claimable_state"]:
        return []
    state = r["state"]
    if state == TodoState.WAITING:
        return [
            {
                "reason": "waiting",
                "detail": "It waits until what waiting_for names resolves"
                + (f" ({r['dependencies_left']} dependencies unfinished)." if r["dependencies_left"] else "."),
                "waiting_for": r["waiting_for"],
                "dependencies_left": r["dependencies_left"],
            }
        ]
    if state == TodoState.SCHEDULED:
        return [{"reason": "run_at", "detail": "It is scheduled: claims take it from run_at.", "at": _iso(r["run_at"])}]
    if state == TodoState.FAILED and r["next_retry_at"] is not None:
        return [
            {
                "reason": "retry_at",
                "detail": "It failed; its retry falls due at next_retry_at.",
                "at": _iso(r["next_retry_at"]),
            }
        ]
    if state == TodoState.CLAIMED:
        detail = (
            "An agent holds its lease now."
            if r["live_lease"]
            else "Its lease lapsed at the attempt cap: the reaper dead-letters it."
        )
        return [{"reason": "state", "state": "claimed", "detail": detail}]
    label = states.label_of(state, dead_letter=r["dead_letter"])
    return [{"reason": "state", "state": label, "detail": f"It is {label}: nothing claims it again."}]


def _queue_reasons(r: dict[str, Any], key: str | None = None) -> list[Reason]:
    """The queue's controls that stop a claim now: paused, max_claimed reached, the rate bucket empty, and the
    todo's fair key at its max_claimed_per_key."""
    reasons: list[Reason] = []
    if r["paused"]:
        reasons.append({"reason": "queue_paused", "detail": "Its queue is paused."})
    if r["max_claimed"] is not None and r["live_leases"] >= r["max_claimed"]:
        reasons.append(
            {
                "reason": "max_claimed",
                "detail": f"Its queue has {r['live_leases']} live leases, its max_claimed is {r['max_claimed']}.",
                "live_leases": r["live_leases"],
                "max_claimed": r["max_claimed"],
            }
        )
    if r["rate_per_second"] is not None and (r["tokens"] or 0) < 1:
        wait = (1 - (r["tokens"] or 0)) / r["rate_per_second"]
        reasons.append(
            {
                "reason": "rate_limited",
                "detail": f"Its queue's rate bucket is empty: the next token comes in {wait:.2f} s.",
                "retry_after_seconds": round(wait, 3),
            }
        )
    if key is not None and r["max_claimed_per_key"] is not None and r["key_leases"] >= r["max_claimed_per_key"]:
        reasons.append(
            {
                "reason": "per_key_cap",
                "detail": f"Its fair_key {key!r} has {r['key_leases']} live leases, the queue's max_claimed_per_key "
                f"is {r['max_claimed_per_key']}.",
            }
        )
    return reasons


def explain_todo(todo_id: str, *, agent: Agent) -> dict[str, Any]:
    """Every reason a claim by ``agent`` would not take the todo now, in order: its state (waits and
    dependencies, run_at, a retry's time), the assignee, the queue's pause, max_claimed, rate bucket and per-key
    cap, a parked named limit (issue 31), the fair-share turn (a note: decided by the claim), the tree's budget,
    and whether any active agent's claim scopes cover its queue (with when a lease of it was last taken).
    ``claimable``: no reason."""
    rows = fetchall(EXPLAIN_TODO, {"id": todo_id, "agent": agent.name, "visible": visible_patterns(agent)})
    if not rows:
        raise TodoNotFound(f"No todo {todo_id}.")
    names = [
        "queue", "state", "dead_letter", "claimable_state", "live_lease", "waiting_for", "dependencies_left", "run_at",
        "run_at_ahead", "next_retry_at", "assignee", "assignee_ok", "registered", "paused", "max_claimed",
        "live_leases", "rate_per_second", "tokens", "max_claimed_per_key", "key_leases", "fair", "fair_key",
        "reserved", "budget_open", "root", "last_claimed_at",
    ]  # fmt: skip
    r = dict(zip(names, rows[0], strict=True))
    reasons = _state_reasons(r)
    if not r["assignee_ok"]:
        reasons.append(
            {"reason": "assignee", "detail": f"It is assigned to {r['assignee']}: only that agent claims it."}
        )
    reasons += _queue_reasons(r, key=r["fair_key"])
    parked = fetchall(sql.BLOCKED_OF, {"ids": [todo_id]})
    if parked and parked[0][1] is not None:  # issue 31: a named limit holding it is parked (a quota wall)
        shown = parked[0][1]
        shown = json.loads(shown) if isinstance(shown, str) else shown
        reasons.append({"reason": "limit_parked", "detail": "A named limit holding it is parked.", "blocked": shown})
    notes: list[Reason] = []
    if r["fair"] and r["reserved"]:
        notes.append(
            {
                "reason": "fair_share_reserved",
                "detail": "A fair turn has already given it its key's turn (a reservation, under concurrent "
                "claimers): the next claims of its queue take it, in that turn's order.",
            }
        )
    elif r["fair"]:
        notes.append(
            {
                "reason": "fair_share",
                "detail": "Its queue shares claims among fair keys in weighted turns: it waits for its key's turn "
                "behind other keys' todos.",
            }
        )
    if not r["budget_open"]:
        reasons.append(
            {
                "reason": "budget",
                "detail": f"Its tree (root {r['root']}) has spent its budget: an operator raises it "
                "(PATCH /api/v1/todos/<root>/budget/).",
                "root_id": r["root"],
            }
        )
    queue_name = r["queue"]
    if not agent.may_claim_from(queue_name):
        claimers = [
            a.name
            for a in Agent.objects.filter(is_active=True).only("name", "claim_scopes")
            if a.may_claim_from(queue_name)
        ]
        if claimers:
            reasons.append(
                {
                    "reason": "scopes",
                    "detail": "Your claim scopes do not cover its queue; other agents' do.",
                    "agents": len(claimers),
                }
            )
        else:
            reasons.append(
                {
                    "reason": "no_agent",
                    "detail": "No active agent's claim scopes cover its queue.",
                    "last_claimed_at": _iso(r["last_claimed_at"]),
                }
            )
    return {"id": todo_id, "claimable": not reasons, "reasons": reasons, "notes": notes}


def explain_agent(agent: Agent, *, queues: list[str] | None = None) -> dict[str, Any]:
    """Why a claim by ``agent`` (of ``queues``, names or globs; default all its scopes) gets nothing now, per
    queue (at most MAX_EXPLAINED_QUEUES): its controls, and whether it holds a todo this agent may take, or
    why not (blocked by a budget, assigned to another agent, only scheduled ahead)."""
    wanted = [glob_to_like(q) for q in queues] if queues else ["%"]
    rows = fetchall(
        EXPLAIN_AGENT,
        {
            "agent": agent.name,
            "scopes": agent.claim_like_patterns(),
            "wanted": wanted,
            "n": MAX_EXPLAINED_QUEUES + 1,
        },
    )
    names = ["name", "paused", "max_claimed", "live_leases", "rate_per_second", "tokens", "takeable",
             "budget_blocked", "assigned_elsewhere", "scheduled"]  # fmt: skip
    answer = []
    for row in rows[:MAX_EXPLAINED_QUEUES]:
        r = dict(zip(names, row, strict=True))
        reasons = _queue_reasons(r)
        if not r["takeable"]:
            if r["budget_blocked"]:
                reasons.append({"reason": "budget", "detail": "Its pending todos' trees have spent their budgets."})
            if r["assigned_elsewhere"]:
                reasons.append({"reason": "assignee", "detail": "Its pending todos are assigned to other agents."})
            if r["scheduled"]:
                reasons.append({"reason": "run_at", "detail": "Its todos are scheduled for later."})
            reasons.append({"reason": "empty", "detail": "Nothing in it is claimable by you now."})
        answer.append({"queue": r["name"], "claimable": not reasons, "reasons": reasons})
    outside = agent.outside_claim_scopes(queues) if queues else []
    return {
        "agent": agent.name,
        "queues": answer,
        "truncated": len(rows) > MAX_EXPLAINED_QUEUES,
        "outside_scopes": outside,
    }
