"""The todo state machine: the only code that writes a todo's state.

Each transition is one guarded statement (see todos/sql/), named with SPEC.md's verbs so call sites read
``queue.complete(...)``. A guard that matches no row is classified by a follow-up read: TodoNotFound if
the todo is absent or outside the caller's scopes, TodoConflict (with the current state) otherwise.
Every door, the batch ones included, is counted in switchboard_todo_transitions_total (todos/metrics.py);
the cursor and row plumbing is in todos/rows.py.

The modules mirror todos/sql/: ``create``, ``claim``, ``lease`` (the holder's doors), ``waits``,
``operators``, ``reaper``, ``flow`` (parking on a quota wall, issue 31) and ``trees`` (issue 30: cascades, late
results, budgets); ``_common`` holds what they share. Callers import this package and use its names, never a
module's.
"""

from todos.queue._common import JSON
from todos.queue.claim import claim, claim_next
from todos.queue.create import CREATE_FIELDS, TodoRef, create, create_many
from todos.queue.flow import park
from todos.queue.lease import complete, complete_many, fail, heartbeat, release
from todos.queue.operators import (
    cancel,
    cancel_many,
    discard,
    discard_many,
    force_release,
    force_release_many,
    retry_dead_letter,
    retry_dead_letter_many,
    retry_now,
    retry_now_many,
    run_now,
    run_now_many,
    set_priority,
    set_priority_many,
)
from todos.queue.people import decide, escalate_people, reassign, remind_people
from todos.queue.push import add_push_config, delete_push_config
from todos.queue.reaper import (
    LapseResult,
    ReapResult,
    expire_unstarted,
    promote_due_retries,
    promote_due_scheduled,
    reap_once,
    requeue_lapsed,
    time_out_waits,
)
from todos.queue.trees import CHILDREN_POLICIES, resume_cascades, set_budget
from todos.queue.waits import resolve, resolve_events, resolve_token, wait

__all__ = [
    "CHILDREN_POLICIES",
    "CREATE_FIELDS",
    "JSON",
    "LapseResult",
    "ReapResult",
    "TodoRef",
    "add_push_config",
    "cancel",
    "cancel_many",
    "claim",
    "claim_next",
    "complete",
    "complete_many",
    "create",
    "create_many",
    "decide",
    "delete_push_config",
    "discard",
    "discard_many",
    "escalate_people",
    "expire_unstarted",
    "fail",
    "force_release",
    "force_release_many",
    "heartbeat",
    "park",
    "promote_due_retries",
    "promote_due_scheduled",
    "reap_once",
    "reassign",
    "release",
    "remind_people",
    "requeue_lapsed",
    "resolve",
    "resolve_events",
    "resolve_token",
    "resume_cascades",
    "retry_dead_letter",
    "retry_dead_letter_many",
    "retry_now",
    "retry_now_many",
    "run_now",
    "run_now_many",
    "set_budget",
    "set_priority",
    "set_priority_many",
    "time_out_waits",
    "wait",
]
