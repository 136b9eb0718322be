"""New queues under glob create scopes (issue 28, M4): an agent whose create scope is a glob (``jobs.*``)
may add queues under it only while fewer than max_queues_per_create_scope() exist there, decided in the
create's transaction. Every queue costs each claim whose scopes cover it an index descent, and the queue
list, the dashboard and /metrics a row each."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from todos import sql
from todos.errors import QueueLimitReached
from todos.globs import compile_glob, wildcards
from todos.limits import max_queues_per_create_scope
from todos.models import Agent, glob_to_like
from todos.rows import fetchall


def new_queues_under_globs(agent: Agent, queues: Iterable[str]) -> dict[str, list[str]]:
    """The queues of a create that do not exist yet and that the agent reaches only through glob create
    scopes, each with those globs (empty for nearly every create: one primary-key probe per queue). A staff
    session (an unsaved agent, todos/auth.py staff_agent) and exact-name scopes are never limited."""
    if agent.pk is None:
        return {}
    exact = {s for s in agent.create_scopes if not wildcards(s)}
    globbed = {q: globs for q in queues if q not in exact and (globs := _globs_naming(agent, q))}
    if not globbed:
        return {}
    unregistered = {name for (name,) in fetchall(sql.UNREGISTERED_QUEUES, {"names": sorted(globbed)})}
    return {q: globs for q, globs in globbed.items() if q in unregistered}


def _globs_naming(agent: Agent, queue: str) -> list[str]:
    return [s for s in agent.create_scopes if wildcards(s) and compile_glob(s).matches(queue)]


def admit_new_queues(new_queues: dict[str, list[str]], items: Sequence[Mapping[str, Any]], batch: bool) -> None:
    """Refuse (QueueLimitReached, nothing written) a create that would add a queue under glob create scopes
    that each already cover max_queues_per_create_scope() queues, counting the create's other new queues
    under the same glob. Runs in the create's transaction: LOCK_CREATE_SCOPES serialises the creates that add
    queues under one glob, so under concurrency the limit holds exactly per glob. Two different globs that
    overlap (jobs.* and jobs.a*, of two agents) take different locks, so jobs.* may overshoot by what
    concurrent creates under jobs.a* add meanwhile: bounded by jobs.a*'s own limit, never a growth without
    bound. Staff and the system take no lock; they are not the attacker this limit is for."""
    cap = max_queues_per_create_scope()
    globs = sorted({g for names in new_queues.values() for g in names})
    fetchall(sql.LOCK_CREATE_SCOPES, {"globs": globs})
    [(still_new, counts)] = fetchall(
        sql.ADMIT_NEW_QUEUES,
        {"names": sorted(new_queues), "patterns": [glob_to_like(g) for g in globs], "cap": cap},
    )
    covered = dict(zip(globs, counts, strict=True))
    adding = {g: sum(1 for q in still_new if g in new_queues[q]) for g in globs}
    for index, item in enumerate(items):
        queue = item["queue"]
        if queue in still_new and not any(covered[g] + adding[g] <= cap for g in new_queues[queue]):
            scope = new_queues[queue][0]
            detail = (
                f"Queue {queue!r} does not exist, and the create scope {scope!r} already covers "
                f"{min(covered[scope], cap)} queues (at most {cap}: MAX_QUEUES_PER_CREATE_SCOPE). "
                "Use an existing queue, or ask an operator."
            )
            where: dict[str, Any] = {"field": "queue"}
            if batch:
                detail, where = f"Item {index}: {detail}", {"field": f"todos.{index}.queue", "index": index}
            raise QueueLimitReached(detail, limit=cap, scope=scope, **where)
