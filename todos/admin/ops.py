"""The operator's actions on todos: what each one calls in todos/queue/, how its skips are
explained, and how it is recorded in the admin log. Both the changelist actions (the selected rows)
and the "apply to every matching todo" view (todos/admin/bulk.py) run through ``apply``."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import User

from todos import queue, states
from todos.errors import AlreadyDecided, InvalidTransitionInput, NotAResolver, TodoConflict, TodoNotFound
from todos.models import Todo, Waitpoint


@dataclass(frozen=True)
class Op:
    name: str
    label: str  # as shown in the action menu
    verb: str  # "3 retried"
    skip_hint: str  # why the skipped ones were skipped, after their states
    run: Callable[[str, str, str], Todo]  # (todo_id, operator, note) -> the todo after the transition
    run_many: Callable[[list[str], str, str], list[Todo]]  # (ids, operator, note) -> the todos it moved
    note_label: str = ""  # non-empty: the action asks for a note on a confirmation page first

    def log_message(self, note: str) -> str:
        return f"{self.label}" + (f": {note}" if note else "")


def _priority(note: str) -> int:
    """The priority an operator typed into the note field; queue.set_priority checks its range."""
    try:
        return int(note.strip())
    except ValueError:
        raise InvalidTransitionInput(f"{note.strip()!r} is not a whole number.", field="priority") from None


def _budget(note: str) -> Any:
    """The budget an operator typed into the note field, as JSON; queue.set_budget checks its counters."""
    try:
        return json.loads(note)
    except ValueError:
        raise InvalidTransitionInput(f"{note.strip()!r} is not JSON.", field="budget") from None


def _set_budgets(ids: list[str], note: str) -> list[Todo]:
    """set_budget of each root among ``ids`` (a budget is set by hand, on few roots: one statement each)."""
    budget, done = _budget(note), []
    for pk in ids:
        try:
            done.append(queue.set_budget(pk, budget=budget))
        except TodoConflict:
            continue  # not a root: skipped, like any todo an action's guard passes over
    return done


def _resolve(verdict: str) -> tuple[Callable[[str, str, str], Todo], Callable[[list[str], str, str], list[Todo]]]:
    """An operator's approve or reject of waiting todos: each becomes pending with resolution {by:
    "operator", verdict, note}. One statement per todo: resolving is rare and done by hand."""

    def one(pk: str, who: str, note: str) -> Todo:
        if Waitpoint.objects.filter(pk=pk, people__isnull=False, resolved_at__isnull=True).exists():
            # A wait for people (issue 29): the operator decides it as a person, so the agent gets the
            # same resolution shape whoever decides ({by: "person", decision, text, decided_by}).
            operator = User.objects.get(username=who)
            decision = "approve" if verdict == "approved" else "reject"
            return queue.decide(pk, user=operator, decision=decision, text=note)
        return queue.resolve(pk, by=who, verdict=verdict, note=note)

    def many(ids: list[str], who: str, note: str) -> list[Todo]:
        moved = []
        for pk in ids:
            try:
                moved.append(one(pk, who, note))
            except (TodoConflict, TodoNotFound, AlreadyDecided, NotAResolver):
                continue  # explained by _classify
        return moved

    return one, many


OPS: dict[str, Op] = {
    op.name: op
    for op in (
        Op(
            "retry_reset",
            "Retry with a fresh budget",
            "retried",
            "only dead-letters can be retried",
            lambda pk, who, note: queue.retry_dead_letter(pk, mode="reset", operator=who, note=note),
            lambda ids, who, note: queue.retry_dead_letter_many(ids, mode="reset", operator=who, note=note),
            note_label="Note (optional, kept in the todo's history)",
        ),
        Op(
            "retry_once",
            "Retry once",
            "retried",
            "only dead-letters can be retried",
            lambda pk, who, note: queue.retry_dead_letter(pk, mode="once", operator=who, note=note),
            lambda ids, who, note: queue.retry_dead_letter_many(ids, mode="once", operator=who, note=note),
            note_label="Note (optional, kept in the todo's history)",
        ),
        Op(
            "retry_now",
            "Retry now (skip the backoff)",
            "made claimable now",
            "only retry-waiting todos can be retried now",
            lambda pk, who, note: queue.retry_now(pk, operator=who),
            lambda ids, who, note: queue.retry_now_many(ids, operator=who),
        ),
        Op(
            "discard",
            "Discard (finish without running)",
            "discarded",
            "only pending and failed todos can be discarded; force-release a claimed one first",
            lambda pk, who, note: queue.discard(pk, operator=who, reason=note),
            lambda ids, who, note: queue.discard_many(ids, operator=who, reason=note),
            note_label="Reason (optional, stored in the todo's result)",
        ),
        Op(
            "cancel",
            "Cancel (stop it for good; revokes a claim)",
            "cancelled",
            "only pending, scheduled, waiting, retry-waiting and claimed todos can be cancelled",
            lambda pk, who, note: queue.cancel(pk, operator=who, reason=note),
            lambda ids, who, note: queue.cancel_many(ids, operator=who, reason=note),
            note_label="Reason (optional, kept in the todo's history)",
        ),
        Op(
            "cancel_tree",
            "Cancel with its descendants (cascade)",
            "cancelled with their unfinished descendants",
            "only pending, scheduled, waiting, retry-waiting and claimed todos can be cancelled",
            lambda pk, who, note: queue.cancel(pk, operator=who, reason=note, cascade=True),
            lambda ids, who, note: queue.cancel_many(ids, operator=who, reason=note, cascade=True),
            note_label="Reason (optional, kept in the todo's history)",
        ),
        Op(
            "set_budget",
            "Set a tree's budget (roots only)",
            "given the new budget",
            "only a tree's root has a budget",
            lambda pk, who, note: queue.set_budget(pk, budget=_budget(note)),
            lambda ids, who, note: _set_budgets(ids, note),
            note_label='New budget as JSON, e.g. {"cost_usd": 10}',
        ),
        Op(
            "run_now",
            "Run now (do not wait for run_at)",
            "made claimable now",
            "only scheduled todos can be run now",
            lambda pk, who, note: queue.run_now(pk, operator=who),
            lambda ids, who, note: queue.run_now_many(ids, operator=who),
        ),
        Op(
            "set_priority",
            "Change priority",
            "given the new priority",
            "only pending and scheduled todos have a priority to change",
            lambda pk, who, note: queue.set_priority(pk, priority=_priority(note)),
            lambda ids, who, note: queue.set_priority_many(ids, priority=_priority(note)),
            note_label="New priority, -100 to 100 (lower runs first)",
        ),
        Op(
            "approve",
            "Approve a wait (it runs again, resolution approved)",
            "approved",
            "only waiting todos can be approved",
            *_resolve("approved"),
            note_label="Note (optional, handed to the agent in the resolution)",
        ),
        Op(
            "reject",
            "Reject a wait (it runs again, resolution rejected)",
            "rejected",
            "only waiting todos can be rejected",
            *_resolve("rejected"),
            note_label="Note (optional, handed to the agent in the resolution)",
        ),
        Op(
            "force_release",
            "Force-release a stuck claim",
            "released",
            "only claimed todos can be force-released",
            lambda pk, who, note: queue.force_release(pk, operator=who),
            lambda ids, who, note: queue.force_release_many(ids, operator=who),
        ),
    )
}


@dataclass
class Outcome:
    succeeded: int = 0
    skipped: Counter[str] = field(default_factory=Counter)

    def add(self, other: Outcome) -> None:
        self.succeeded += other.succeeded
        self.skipped.update(other.skipped)

    def message(self, op: Op) -> str:
        text = f"{self.succeeded} {op.verb}"
        if self.skipped:
            parts = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
            text += f"; {self.skipped.total()} skipped: {parts} ({op.skip_hint})"
        return text + "."


def skip_reason(exc: TodoConflict | TodoNotFound) -> str:
    """What the todo was when the guard refused it, in the admin's words."""
    if isinstance(exc, TodoNotFound):
        return "gone"
    if exc.extra.get("reason") == "idempotency_key_taken":
        return "with their idempotency key held by a newer todo"
    return states.label_of(exc.state, dead_letter=bool(exc.extra.get("dead_letter")))


def _classify(ids: set[str]) -> Counter[str]:
    """Why each of these was not moved: its state now (one query for the lot); absent ones are gone."""
    reasons: Counter[str] = Counter()
    for todo in Todo.objects.filter(pk__in=ids).only("state", "next_retry_at"):
        reasons[states.label(todo)] += 1
    missing = len(ids) - reasons.total()
    if missing:
        reasons["gone"] += missing
    return reasons


def apply(op: Op, ids: Iterable[str], *, user_id: int, operator: str, note: str = "") -> Outcome:
    """Run ``op`` on a batch of todos: one guarded UPDATE for the batch (rows lock for that one
    statement only), one query to explain the skips, and one INSERT into the admin log."""
    ids = list(dict.fromkeys(ids))
    outcome = Outcome()
    done: list[Todo] = []
    if ids:
        try:
            done = op.run_many(ids, operator, note)
            outcome.skipped = _classify(set(ids) - {t.pk for t in done})
        except InvalidTransitionInput as exc:
            # What the operator typed was refused (a priority out of range): nothing moved.
            outcome.skipped[f"refused ({exc.detail})"] += len(ids)
        except TodoConflict:
            # A retry whose idempotency key a newer todo holds fails the whole statement; one by one,
            # the others go through and that one is skipped with its reason.
            done = []
            for pk in ids:
                try:
                    done.append(op.run(pk, operator, note))
                except (TodoConflict, TodoNotFound) as exc:
                    outcome.skipped[skip_reason(exc)] += 1
    outcome.succeeded = len(done)
    if done:
        LogEntry.objects.log_actions(
            user_id=user_id, queryset=done, action_flag=CHANGE, change_message=op.log_message(note)
        )
    return outcome
