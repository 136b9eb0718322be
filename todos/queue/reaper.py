"""The sidecar's sweeps (manage.py reap_leases): lapsed leases, due retries, due scheduled todos and waits
past their timeout, each one batch statement (todos/sql/reaper.py, todos/sql/waits.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from todos import sql, states
from todos.metrics import LEASE_LAPSES, TRANSITIONS
from todos.queue import people
from todos.queue.trees import resume_cascades
from todos.rows import fetchall


@dataclass(frozen=True)
class LapseResult:
    requeued: int
    dead_lettered: int


@dataclass(frozen=True)
class ReapResult:
    requeued: int = 0
    dead_lettered: int = 0
    retries_promoted: int = 0
    scheduled_promoted: int = 0
    waits_timed_out: int = 0
    cascaded: int = 0
    people_reminded: int = 0
    people_escalated: int = 0
    expired: int = 0

    @property
    def total(self) -> int:
        return (
            self.requeued
            + self.dead_lettered
            + self.retries_promoted
            + self.scheduled_promoted
            + self.waits_timed_out
            + self.cascaded
            + self.people_reminded
            + self.people_escalated
            + self.expired
        )


def requeue_lapsed(*, batch: int) -> LapseResult:
    """One batch of lapsed leases: -> pending below the cap, -> dead-letter at it."""
    swept = [row[2] for row in fetchall(sql.REQUEUE_LAPSED, {"batch": batch})]  # (id, queue, state, ...)
    dead = swept.count(states.TodoState.FAILED)
    if swept:
        LEASE_LAPSES.labels(detected_by="reaper", outcome="requeued").inc(len(swept) - dead)
        LEASE_LAPSES.labels(detected_by="reaper", outcome="dead_lettered").inc(dead)
    return LapseResult(requeued=len(swept) - dead, dead_lettered=dead)


def promote_due_retries(*, batch: int) -> int:
    """One batch of failed todos whose retry is due: -> pending."""
    promoted = len(fetchall(sql.PROMOTE_DUE_RETRIES, {"batch": batch}))
    if promoted:
        TRANSITIONS.labels(verb="retry_due", outcome="ok").inc(promoted)
    return promoted


def promote_due_scheduled(*, batch: int) -> int:
    """One batch of scheduled todos whose run_at has come: -> pending."""
    promoted = len(fetchall(sql.PROMOTE_DUE_SCHEDULED, {"batch": batch}))
    if promoted:
        TRANSITIONS.labels(verb="scheduled_due", outcome="ok").inc(promoted)
    return promoted


def _in_batches(step: Callable[[], int], batch: int, should_stop: Any) -> int:
    total = 0
    while not (should_stop and should_stop()):
        n = step()
        total += n
        if n < batch:
            break
    return total


def reap_once(*, batch: int, should_stop: Any = None) -> ReapResult:
    """One sweep of the sidecar: lapsed leases, then due retries, then due scheduled todos, then waits past
    their timeout, then people's reminders and escalations (and expired decision links), batch after batch
    until none are left (or ``should_stop()`` says so between batches); then one step of each cascading
    cancel left over (issue 30: CASCADE_BATCH descendants each)."""
    requeued = dead = 0
    while True:
        lapse = requeue_lapsed(batch=batch)
        requeued += lapse.requeued
        dead += lapse.dead_lettered
        if lapse.requeued + lapse.dead_lettered < batch or (should_stop and should_stop()):
            break
    promoted = _in_batches(lambda: promote_due_retries(batch=batch), batch, should_stop)
    scheduled = _in_batches(lambda: promote_due_scheduled(batch=batch), batch, should_stop)
    timed_out = _in_batches(lambda: time_out_waits(batch=batch), batch, should_stop)
    # Waits for people (issue 29): reminders, then escalations, each once per wait, with its notices; then
    # expired decision links go.
    reminded = _in_batches(lambda: people.remind_people(batch=batch), batch, should_stop)
    escalated = _in_batches(lambda: people.escalate_people(batch=batch), batch, should_stop)
    _in_batches(lambda: people.delete_expired_links(batch=batch), batch, should_stop)
    cascaded = 0 if should_stop and should_stop() else resume_cascades()
    expired = _in_batches(lambda: expire_unstarted(batch=batch), batch, should_stop)
    return ReapResult(
        requeued=requeued,
        dead_lettered=dead,
        retries_promoted=promoted,
        scheduled_promoted=scheduled,
        waits_timed_out=timed_out,
        cascaded=cascaded,
        people_reminded=reminded,
        people_escalated=escalated,
        expired=expired,
    )


def expire_unstarted(*, batch: int) -> int:
    """One batch of todos past their start-by deadline (expires_at) that no claim took: -> cancelled, reason
    ``expired`` (todos/sql/flow.py EXPIRE; issue 31)."""
    expired = len(fetchall(sql.EXPIRE, {"batch": batch, "operator": "reaper", "reason": "expired", "visible": ["%"]}))
    if expired:
        TRANSITIONS.labels(verb="expire", outcome="ok").inc(expired)
    return expired


def time_out_waits(*, batch: int) -> int:
    """One batch of waits past their timeout: -> pending (timed_out), or for on_timeout "fail" a failure
    that counts toward the attempts (a retry below the cap, a dead-letter at it)."""
    timed_out = len(
        fetchall(
            sql.TIME_OUT_WAITS,
            {
                "batch": batch,
                "backoff_base": float(settings.QUEUE_RETRY_BASE_SECONDS),
                "backoff_cap": float(settings.QUEUE_RETRY_CAP_SECONDS),
            },
        )
    )
    if timed_out:
        TRANSITIONS.labels(verb="wait_timeout", outcome="ok").inc(timed_out)
    return timed_out
