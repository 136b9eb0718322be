"""Every hand-written statement of the queue, named for its transition (procrastinate and river keep
theirs the same way). Each is ONE statement: the guard sits in the WHERE clause, times come from the
database's now() (SPEC decision 7), and RETURNING hands back the row as it is after the change.

Why raw SQL here and the ORM elsewhere: the claim scan needs one index lookup per queue (a LATERAL
join, SPEC trap 1) and every transition must be a single guarded UPDATE ... RETURNING (trap 2);
Django's ORM can express neither. `make bench` measures the result against the same
cycle written directly against psycopg.

Parameters common to several statements:
  visible   LIKE patterns of the queues the caller may see (its scopes; ['%'] for the system)
  agent     the agent's name; a claim's owner is "<agent>" or "<agent>/<worker>"

Conditions on a todo's state come from todos/states.py (``S.DEAD_LETTER.sql("t")``), so each is written
once; the index each statement relies on is the one whose predicate is that same condition
(todos/models.py).

The statements live in one module per seam of the queue (claim, create, reaper, waits, dependencies, lease,
operators, reads, retention, queue_controls, flow); what several of them share is in common. This package re-exports
every public name: callers write ``sql.CLAIM_NEXT``.
"""

from todos.sql.claim import CLAIM_FAIR_READY, CLAIM_NEXT, CLAIM_NEXT_FAIR, CLAIM_NEXT_LIMITED, CLAIM_ONE, CLAIM_ORDER
from todos.sql.common import NOTIFY_CHANNEL, TODO_COLUMNS
from todos.sql.create import (
    ADMIT_NEW_QUEUES,
    BRIEF_COLUMNS,
    CREATE_MANY,
    CREATE_MANY_BRIEF,
    LOCK_CREATE_SCOPES,
    LOCK_ROOT,
    RUNNABLE_BY_KEYS,
    RUNNABLE_BY_KEYS_BRIEF,
    SCHEDULED_NOTIFY_HORIZON_SECONDS,
    SPAWN,
    SPAWN_BRIEF,
    UNREGISTERED_QUEUES,
)
from todos.sql.dependencies import DEPENDENCIES_OF, LINK, REFS_BY_ID, REPOINT, SETTLE, TODOS_BY_ID
from todos.sql.flow import (
    BLOCKED_OF,
    DEBOUNCE,
    DELETE_LIMIT,
    EXPIRE,
    GET_LIMIT,
    HELD_LIMITS,
    PARK,
    PUT_LIMIT,
    SUPERSEDE,
    UNPARK,
)
from todos.sql.lease import (
    COMPLETE,
    COMPLETE_MANY,
    COMPLETE_USAGE,
    CURRENT_STATE,
    FAIL,
    HEARTBEAT,
    HEARTBEAT_USAGE,
    RELEASE,
)
from todos.sql.operators import (
    CANCEL,
    DISCARD,
    FORCE_RELEASE,
    RETRY_DEAD_LETTER,
    RETRY_DEAD_LETTER_MANY,
    RETRY_NOW,
    RUN_NOW,
    SET_PRIORITY,
)
from todos.sql.people import (
    DECIDE,
    DELETE_EXPIRED_LINKS,
    ESCALATE_PEOPLE,
    INBOX,
    REASSIGN,
    REMIND_PEOPLE,
    SPEND_LINK,
    USABLE_LINK,
)
from todos.sql.queue_controls import (
    FORGET_RESERVATIONS,
    PAUSE_QUEUE,
    QUEUE_CONTROLS,
    RESUME_QUEUE,
    SET_QUEUE_LIMITS,
)
from todos.sql.reads import PER_MINUTE, QUEUE_STATS, SECONDS_UNTIL_CLAIMABLE, TREE_OF_ROOT, TREE_WALK
from todos.sql.reaper import PROMOTE_DUE_RETRIES, PROMOTE_DUE_SCHEDULED, REQUEUE_LAPSED
from todos.sql.retention import (
    COUNT_PRUNABLE_QUEUES,
    COUNT_PURGEABLE,
    EVENT_PAGE,
    LOCK_PRUNABLE_QUEUES,
    PRUNE_QUEUES,
    PURGE_CANCELLED,
    PURGE_DEAD,
    PURGE_DONE,
    PURGE_EVENTS,
)
from todos.sql.trees import (
    BUDGET_OPEN,
    CASCADE,
    CASCADES_LEFT,
    LATE_RESULT,
    MARK_BUDGETED,
    ORPHANS,
    RECENT_USAGE,
    SET_BUDGET,
    TREE_BLOCKED,
)
from todos.sql.waits import (
    AGENT_LOCK,
    LINK_WAIT,
    OPEN_EVENT_WAITS,
    RESOLVE_EVENTS,
    RESOLVE_MANUAL,
    RESOLVE_TOKEN,
    TIME_OUT_WAITS,
    WAIT,
    WAITPOINT_BY_HASH,
)

__all__ = [
    "ADMIT_NEW_QUEUES",
    "AGENT_LOCK",
    "BLOCKED_OF",
    "BRIEF_COLUMNS",
    "BUDGET_OPEN",
    "CANCEL",
    "CASCADE",
    "CASCADES_LEFT",
    "CLAIM_FAIR_READY",
    "CLAIM_NEXT",
    "CLAIM_NEXT_FAIR",
    "CLAIM_NEXT_LIMITED",
    "CLAIM_ONE",
    "CLAIM_ORDER",
    "COMPLETE",
    "COMPLETE_MANY",
    "COMPLETE_USAGE",
    "COUNT_PRUNABLE_QUEUES",
    "COUNT_PURGEABLE",
    "CREATE_MANY",
    "CREATE_MANY_BRIEF",
    "CURRENT_STATE",
    "DEBOUNCE",
    "DECIDE",
    "DELETE_EXPIRED_LINKS",
    "DELETE_LIMIT",
    "DEPENDENCIES_OF",
    "DISCARD",
    "ESCALATE_PEOPLE",
    "EVENT_PAGE",
    "EXPIRE",
    "FAIL",
    "FORCE_RELEASE",
    "FORGET_RESERVATIONS",
    "GET_LIMIT",
    "HEARTBEAT",
    "HEARTBEAT_USAGE",
    "HELD_LIMITS",
    "INBOX",
    "LATE_RESULT",
    "LINK",
    "LINK_WAIT",
    "LOCK_CREATE_SCOPES",
    "LOCK_PRUNABLE_QUEUES",
    "LOCK_ROOT",
    "MARK_BUDGETED",
    "NOTIFY_CHANNEL",
    "OPEN_EVENT_WAITS",
    "ORPHANS",
    "PARK",
    "PAUSE_QUEUE",
    "PER_MINUTE",
    "PROMOTE_DUE_RETRIES",
    "PROMOTE_DUE_SCHEDULED",
    "PRUNE_QUEUES",
    "PURGE_CANCELLED",
    "PURGE_DEAD",
    "PURGE_DONE",
    "PURGE_EVENTS",
    "PUT_LIMIT",
    "QUEUE_CONTROLS",
    "QUEUE_STATS",
    "REASSIGN",
    "RECENT_USAGE",
    "REFS_BY_ID",
    "RELEASE",
    "REMIND_PEOPLE",
    "REPOINT",
    "REQUEUE_LAPSED",
    "RESOLVE_EVENTS",
    "RESOLVE_MANUAL",
    "RESOLVE_TOKEN",
    "RESUME_QUEUE",
    "RETRY_DEAD_LETTER",
    "RETRY_DEAD_LETTER_MANY",
    "RETRY_NOW",
    "RUNNABLE_BY_KEYS",
    "RUNNABLE_BY_KEYS_BRIEF",
    "RUN_NOW",
    "SCHEDULED_NOTIFY_HORIZON_SECONDS",
    "SECONDS_UNTIL_CLAIMABLE",
    "SETTLE",
    "SET_BUDGET",
    "SET_PRIORITY",
    "SET_QUEUE_LIMITS",
    "SPAWN",
    "SPAWN_BRIEF",
    "SPEND_LINK",
    "SUPERSEDE",
    "TIME_OUT_WAITS",
    "TODOS_BY_ID",
    "TODO_COLUMNS",
    "TREE_BLOCKED",
    "TREE_OF_ROOT",
    "TREE_WALK",
    "UNPARK",
    "UNREGISTERED_QUEUES",
    "USABLE_LINK",
    "WAIT",
    "WAITPOINT_BY_HASH",
]
