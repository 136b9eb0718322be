"""The todo, the agents that work on todos, and the registry of queue names.

The todo's states (TodoState, with who moves a todo in and out of each) and the conditions derived from
its columns (dead-letter, retry-waiting, lease lapsed, ...) are defined in todos/states.py; the partial
indexes and CHECK constraints below are built from them. The database keeps the queue registry itself
(a trigger, migration 0009), whatever path writes a todo."""

from __future__ import annotations

import hashlib
import re
import secrets
import string
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex, OpClass
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Func, Q, Value
from django.db.models.fields.json import KT
from django.db.models.functions import Left, Now, Upper

from todos import states
from todos.globs import compile_glob, matches_any, wildcards
from todos.limits import MAX_FAIR_KEY_CHARS, MAX_SCOPE_WILDCARDS
from todos.states import TodoState

QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$")
# A named limit's name (issue 31): a queue name's alphabet, shorter (todos/limits.py MAX_LIMIT_NAME_CHARS).
LIMIT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}$")
SCOPE_RE = re.compile(r"^[A-Za-z0-9._:/*?-]{1,200}$")
# Switchboard's own queues (issue 29: outbound notices, todos/notices.py). Their leading "_" is outside
# QUEUE_NAME_RE, so only the system creates into them (todos/queue/create.py), and an agent's scope reaches
# them only when it names them with a literal leading "_" (Agent.*_like_patterns).
SYSTEM_QUEUES = frozenset({"_switchboard.notify"})


def new_todo_id() -> str:
    return f"td_{uuid.uuid4().hex}"


def validate_limit_name(value: str) -> None:
    if not LIMIT_NAME_RE.match(value or ""):
        raise ValidationError(
            "Limit names are 1-100 characters of letters, digits and . _ : / -, starting with a letter or digit."
        )


def validate_queue_name(value: str) -> None:
    if not QUEUE_NAME_RE.match(value or ""):
        raise ValidationError(
            "Queue names are 1-200 characters of letters, digits and . _ : / -, starting with a letter or digit."
        )


def validate_scope(value: str) -> None:
    if not SCOPE_RE.match(value or ""):
        raise ValidationError("A scope is a queue name or a glob using * and ?, e.g. github.*")
    if wildcards(value) > MAX_SCOPE_WILDCARDS:
        raise ValidationError(f"A scope holds at most {MAX_SCOPE_WILDCARDS} wildcards (* or ?).")


_QUEUE_FIRST_CHARS = string.ascii_letters + string.digits  # what QUEUE_NAME_RE lets an agent's queue start with


def _without_system_queues(like: str) -> list[str]:
    """LIKE patterns matching the names ``like`` matches, except those starting with "_" (the system's
    queues). LIKE cannot say "not _", so a leading wildcard becomes one pattern per allowed first character."""
    if like.startswith("%"):
        # % matches the empty run too: then the rest must start the name, and must not reach "_" either.
        rest = like.lstrip("%")
        return [c + "%" + rest for c in _QUEUE_FIRST_CHARS] + (_without_system_queues(rest) if rest else [])
    if like.startswith("_"):
        return [c + like[1:] for c in _QUEUE_FIRST_CHARS]
    if like.startswith("\\_"):
        return []
    return [like]


def scope_like_patterns(scope: str) -> list[str]:
    """An agent's scope as the LIKE patterns every query filters queues by. A scope reaches Switchboard's own
    queues (SYSTEM_QUEUES, names starting with "_") only when it starts with a literal "_" itself, an
    operator's explicit grant: ``*`` covers every agent's queue but never ``_switchboard.notify``."""
    like = glob_to_like(scope)
    if scope.startswith("_"):
        return [like]
    return _without_system_queues(like)


def scope_matches(scopes: Iterable[str], queue: str) -> bool:
    """The Python side of scope_like_patterns: whether one of ``scopes`` covers ``queue``."""
    if queue.startswith("_"):
        scopes = [s for s in scopes if s.startswith("_")]
    return matches_any(scopes, queue)


def glob_to_like(pattern: str) -> str:
    """Turn a scope glob (``*`` and ``?`` only) into a SQL LIKE pattern with ``\\`` as the escape."""
    escaped = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%").replace("?", "_")


@models.CharField.register_lookup
class LikeAny(models.Lookup):
    """``queue__like_any=[patterns]`` → ``queue LIKE ANY(patterns)``: the scope filter on every query."""

    lookup_name = "like_any"
    prepare_rhs = False

    # The stubs narrow a lookup's params to str | int; this one binds a list (a text[] parameter).
    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:  # type: ignore[override]
        lhs, lhs_params = self.process_lhs(compiler, connection)
        return f"{lhs} LIKE ANY(%s::text[])", [*lhs_params, list(self.rhs)]


# Re-exported: the states themselves, and their conditions, live in todos/states.py.
__all__ = ["TodoState"]
# Scheduling's vocabulary (issue 12) lives in todos/states.py too; these names are kept for its callers.
PRIORITY_MIN, PRIORITY_MAX = states.PRIORITY_MIN, states.PRIORITY_MAX


class OnDependencyFailure(models.TextChoices):
    # What a dependent does when one of its dependencies ends otherwise than done (a dead-letter, cancelled):
    # it is cancelled too (its history names the dependency), or it runs anyway.
    CANCEL = "cancel", "cancel"
    RUN = "run", "run"


class TodoQuerySet(models.QuerySet["Todo"]):
    def visible_to(self, agent: Agent) -> TodoQuerySet:
        """Todos in the queues the agent may see (its claim and create scopes)."""
        return self.filter(queue__like_any=agent.visible_like_patterns())

    def dead_lettered(self) -> TodoQuerySet:
        return self.filter(states.DEAD_LETTER.q)


# The unique index that makes a runnable todo hold its (queue, idempotency_key): a transition that
# revives a todo reads a violation of it, by name, as "the key is taken" (todos/rows.py).
RUNNABLE_KEY_CONSTRAINT = "todo_runnable_idempotency_key"

# Idempotency keys the system makes: a webhook route's todo (ingest/routing.py, ``ingest:<delivery id>:
# <route id>``) and a schedule's tick (todos/schedules.py, ``schedule:<name>:<tick>``). Both can be
# predicted, so an agent that could create a todo under one first would have the real delivery or tick
# find it and make nothing (security-review L3). Agents may not use them; the system's creates do not
# go through the validator.
SYSTEM_KEY_PREFIXES = ("ingest:", "schedule:")


def is_system_key(key: str | None) -> bool:
    return key is not None and key.startswith(SYSTEM_KEY_PREFIXES)


def validate_caller_idempotency_key(value: str) -> None:
    if is_system_key(value):
        raise ValidationError(
            f"Keys starting with {' or '.join(repr(p) for p in SYSTEM_KEY_PREFIXES)} are reserved for the todos "
            "of webhook routes and schedules."
        )


# Sources the task protocols give the todos an agent creates through them (issue 33): MCP Tasks on the
# 2025-11-25 wire (``mcp-task:<agent key>``, what its tasks/list lists) and A2A (``a2a:<agent key>``, what
# ListTasks lists). An agent may not claim one for a todo it creates over REST: it would put the todo in
# another agent's task list.
TASK_SOURCE_PREFIXES = ("mcp-task:", "a2a:")


def validate_caller_source(value: str) -> None:
    if value.startswith(TASK_SOURCE_PREFIXES):
        raise ValidationError(
            f"Sources starting with {' or '.join(repr(p) for p in TASK_SOURCE_PREFIXES)} are reserved for the "
            "todos of MCP tasks and A2A messages."
        )


# The triage view groups dead-letters by their last error's first this many characters: enough to tell
# "KeyError 'pr'" from "KeyError 'sha'", short enough that a message with an id or a time at its end
# still mostly falls in one group.
LAST_ERROR_CHARS = 120


def last_error() -> Func:
    """The newest entry of ``errors`` (``errors #>> '{-1,error}'``), cut to LAST_ERROR_CHARS: the admin's
    list column, its triage groups and its last-error filter all use this one expression, and the index
    todo_dead_last_error is built on it (a different expression would not be served by it)."""
    return Left(KT("errors__-1__error"), LAST_ERROR_CHARS)


class Todo(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_todo_id, editable=False)
    queue = models.CharField(max_length=200, validators=[validate_queue_name])
    source = models.CharField(max_length=100, blank=True, default="")
    kind = models.CharField(max_length=100, blank=True, default="")
    title = models.CharField(max_length=500, blank=True, default="")
    payload = models.JSONField(default=dict, blank=True)
    # Indexed by todo_event (partial: most todos have no event), not by Django's default full index.
    event = models.ForeignKey(
        "events.Event", null=True, blank=True, on_delete=models.PROTECT, related_name="todos", db_index=False
    )
    idempotency_key = models.CharField(max_length=300, null=True, blank=True)
    assignee = models.CharField(max_length=100, null=True, blank=True)
    state = models.CharField(max_length=10, choices=TodoState.choices, default=TodoState.PENDING)
    owner = models.CharField(max_length=200, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=5)
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    claimed_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    next_retry_at = models.DateTimeField(null=True, blank=True)
    lease_id = models.CharField(max_length=40, null=True, blank=True)
    errors = models.JSONField(default=list, blank=True)
    # When the todo may first run: its creation time unless scheduled. Claims order by (priority, run_at).
    run_at = models.DateTimeField(db_default=Now())
    priority = models.SmallIntegerField(db_default=0)
    # Fair share (issue 22): on a fair queue, claims take keys in weighted round robin (todos/sql/,
    # CLAIM_NEXT); "" is a key like any other. Ignored by other queues.
    fair_key = models.CharField(max_length=MAX_FAIR_KEY_CHARS, blank=True, default="", db_default="")
    # While waiting (issue 20): what it waits for, as the waiter gave it (never a token). The matching
    # machinery is in Waitpoint. resolution: how the last wait ended ({by, at, data | event | todos}),
    # kept until the next wait so that the next claim reads it.
    waiting_for = models.JSONField(null=True, blank=True)
    resolution = models.JSONField(null=True, blank=True)
    # Dependencies (issue 20). depends_on: the todos it was created to wait for, in order (null: none, and its
    # JSON lists none without a query). dependencies_left: those not settled yet, while it waits for them (one
    # open Dependency edge each), whether made at create or by a holder's wait on todos; the statement that
    # finishes the last one moves it on. has_dependents: some todo was made to depend on (or wait for) this
    # one, so the statement that finishes it settles them (todos_settle_dependents).
    depends_on = ArrayField(models.CharField(max_length=40), null=True, blank=True, editable=False)
    dependencies_left = models.IntegerField(db_default=0, editable=False)
    on_dependency_failure = models.CharField(
        max_length=6, choices=OnDependencyFailure.choices, db_default=OnDependencyFailure.CANCEL
    )
    has_dependents = models.BooleanField(db_default=False, editable=False)
    # Delegation (issue 21). The latest progress ({percent, message}) and checkpoint a receipt's holder sent
    # with a heartbeat; the checkpoint outlives lapses and failures, so the next claimer resumes from it.
    progress = models.JSONField(null=True, blank=True)
    checkpoint = models.JSONField(null=True, blank=True)
    # The W3C trace context the todo's work belongs to (sent on create, or started by its delivery).
    traceparent = models.CharField(max_length=55, null=True, blank=True)
    # Lineage (issue 30): the todo whose lease's holder created this one, the tree's first todo and how far
    # below it this one is. A root stores NULL in all three (no bytes beyond the row's null bitmap, so a
    # plain create costs nothing extra) and is shown with its own id as root_id and depth 0 (root_id and
    # tree_depth below). Plain columns, not foreign keys: retention deletes finished parents, and a
    # foreign key would make every create read its parent's index again.
    parent_id = models.CharField(max_length=40, null=True, blank=True, editable=False)
    root_id = models.CharField(max_length=40, null=True, blank=True, editable=False)
    depth = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    # A root's lifetime count of descendants (null: none yet; null on every other todo). The create
    # statement that adds children raises it and checks the root's queue's max_descendants against it,
    # under the root row's lock (todos/sql/create.py, SPAWN).
    descendants = models.PositiveIntegerField(null=True, blank=True, editable=False)
    # A root's own spawn caps, given at its create ({max_depth, max_children, max_descendants}, each optional;
    # null: none): its tree takes the smaller of these and its queue's, so a root can tighten its queue's caps
    # but never loosen them.
    spawn_caps = models.JSONField(null=True, blank=True, editable=False)
    # Cascading cancel (issue 30). children: "cancel" (a create option; null: keep) makes its finish
    # (done, dead-letter, cancelled) cancel its unfinished descendants, in the statement that finishes it
    # (trigger todo_finish_cancels_children). cascade: a cascade left unfinished on this todo ({by, reason,
    # visible}: more than one statement's bound of descendants), which reap_once finishes. revoked_lease_id:
    # the receipt a cancel took from it (never shown), so that its holder's late complete is kept as
    # late_result ({result, at, owner}: a tombstone, not applied) and answered 409 cancelled.
    children = models.CharField(max_length=6, null=True, blank=True, editable=False)
    cascade = models.JSONField(null=True, blank=True, editable=False)
    revoked_lease_id = models.CharField(max_length=40, null=True, blank=True, editable=False)
    late_result = models.JSONField(null=True, blank=True, editable=False)
    # Budgets (issue 30). usage: the counters its receipt's holders reported ({name: number}); on a root,
    # tree_usage sums its whole tree's (its own included), raised in the statement that reports usage, and
    # budget ({name: limit}) caps it: budget_exhausted is set there once a counter reaches its limit, and
    # claims then skip the tree's todos (todos/sql/trees.py, BUDGET_OPEN) until an operator raises it. On a
    # child, budget_exhausted is the claim's marker, never true: false when its root has a budget (so its
    # claim probes the root), NULL when not (its claim reads no root).
    usage = models.JSONField(null=True, blank=True, editable=False)
    tree_usage = models.JSONField(null=True, blank=True, editable=False)
    budget = models.JSONField(null=True, blank=True, editable=False)
    budget_exhausted = models.BooleanField(null=True, blank=True, editable=False)
    # A producer's callback (issue 29), given at create: {"url", "events": ["done", "dead_lettered"], "agent":
    # the creator, whose webhook_secret signs it, "max_attempts"}. Null for a plain create (no bytes beyond the
    # null bitmap). When the todo becomes done or a dead-letter, the trigger todo_enqueues_callback enqueues
    # its delivery in the system queue in the same statement (todos/sql/functions/todos_enqueue_callback.sql).
    callback = models.JSONField(null=True, blank=True, editable=False)
    # True once an A2A push notification config is added to this todo's task (todos/a2a/push.py); null for
    # every other todo (no bytes beyond the null bitmap). The trigger todo_enqueues_a2a_push fires only for
    # rows where it is true (todos/sql/functions/todos_enqueue_a2a_push.sql): other claims and completes
    # never call it.
    a2a_push = models.BooleanField(null=True, blank=True, editable=False)
    # Named limits (issue 31) this todo names, beside its queue's (null: none, so a plain create writes
    # nothing more): a claim takes it only when every one of them allows (todos/sql/flow.py).
    limits = ArrayField(models.TextField(), null=True, blank=True, editable=False)
    # Start-by deadline (issue 31): not claimed by then, it is cancelled with reason "expired" (the claim never
    # takes it late; the reaper finishes it). Null: none. A todo once claimed has started: it no longer expires.
    expires_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = TodoQuerySet.as_manager()

    class Meta:
        constraints = [
            # SPEC decision 3: every todo that can still run holds its key; done and
            # dead-lettered todos free it. todos/sql's INSERT ... ON CONFLICT names
            # this exact predicate.
            models.UniqueConstraint(
                fields=["queue", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False) & states.RUNNABLE.q,
                name=RUNNABLE_KEY_CONSTRAINT,
            ),
            models.CheckConstraint(condition=Q(attempt__gte=0), name="todo_attempt_not_negative"),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="todo_max_attempts_positive"),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX), name="todo_priority_range"
            ),
            # The state's values and what each state implies about the lease, retry and completion
            # columns (todos/states.py, SHAPES): every write path, not only todos/queue/, keeps them.
            *states.shape_constraints(),
        ]
        indexes = [
            # claim_next, pending branch: one index descent per queue, in claim order (priority, then run_at).
            # run_at NULLS FIRST (the column is never null) so that this stays the only index that yields
            # CLAIM_NEXT's order, whatever indexes the admin gains (todos/sql/, migrations 0007 and 0012).
            models.Index(
                F("queue"),
                F("priority"),
                F("run_at").asc(nulls_first=True),
                condition=states.PENDING.q,
                name="todo_pending_claim_scan",
            ),
            # claim_next's and the reaper's scheduled-due branches, and the long-poll's next wake: per queue
            # a range run_at <= now() that stops at the first future row, so a claim never walks the future
            # (Procrastinate filters its scheduled_at after the index and re-walks them on every fetch).
            models.Index(fields=["queue", "run_at"], condition=states.SCHEDULED.q, name="todo_scheduled_due"),
            # A fair queue's pending todos of one key in claim order (CLAIM_NEXT's fair branch). Pending rows
            # only, so claims and completes of every queue write no entry here; a create writes one.
            models.Index(
                F("queue"),
                F("fair_key"),
                F("priority"),
                F("run_at"),
                condition=states.PENDING.q,
                name="todo_fair_pending",
            ),
            # requeue_lapsed and claim_next's lapsed-lease branch: lapsed leases in expiry order.
            models.Index(fields=["lease_expires_at"], condition=states.CLAIMED.q, name="todo_claimed_lease_expiry"),
            # A limited queue's live leases (todos_live_leases(), migration 0014): the claim statement counts
            # them for every claim of a queue with max_claimed, from this index alone.
            models.Index(fields=["queue", "lease_expires_at"], condition=states.CLAIMED.q, name="todo_live_leases"),
            # promote_due_retries (the reaper): due retries of every queue, in due order.
            models.Index(
                fields=["next_retry_at"],
                condition=states.RETRY_WAITING.q,
                name="todo_retry_due",
            ),
            # The same rows per queue (migration 0019): claim_next's due-retry branch and the long-poll's
            # next due retry (one descent per queue, as for scheduled todos), and queue_stats()'s
            # retry-waiting count (an index-only scan of the caller's queues). todo_retry_due served them
            # by walking every queue's retries. Retry-waiting rows are few (the retry window), so two
            # partial indexes of them cost little. NULLS FIRST (the column is never null here) so that
            # only this index yields their order, as for todo_pending_claim_scan.
            models.Index(
                F("queue"),
                F("next_retry_at").asc(nulls_first=True),
                condition=states.RETRY_WAITING.q,
                name="todo_retry_queue_due",
            ),
            # Dead-letter triage (admin filter, API dead=true, queue counts).
            models.Index(
                fields=["queue", "updated_at"],
                condition=states.DEAD_LETTER.q,
                name="todo_dead_letters",
            ),
            # An event's todos (the FK's PROTECT check, the event admin, replay). Partial: todos that
            # agents create have no event, and a full index would take a write on every transition.
            models.Index(fields=["event"], condition=Q(event__isnull=False), name="todo_event"),
            # The admin's changelist (todos/admin/__init__.py) lists newest first, unfiltered or by one filter.
            # Every full index costs each state change an index tuple (state changes are never HOT
            # updates), so the set is kept small (migration 0006): the state filter is served by the
            # partial indexes above, the queue filter by walking todo_admin_recent backwards; kind and
            # source keep their own because the filters' choices come from a skip scan of them
            # (switchboard/admin_tools.py). docs/benchmarks.md "Admin at 1M rows" has the figures.
            models.Index(fields=["created_at"], name="todo_admin_recent"),
            models.Index(fields=["kind", "created_at"], name="todo_admin_kind_recent"),
            models.Index(fields=["source", "created_at"], name="todo_admin_source_recent"),
            models.Index(
                fields=["assignee", "created_at"],
                condition=Q(assignee__isnull=False),
                name="todo_admin_assignee_recent",
            ),
            # The admin's last-error filter on dead-letters (one triage group, and the every-matching
            # actions on it): an index lookup instead of reading every dead-letter's errors (migration 0019).
            models.Index(last_error(), condition=states.DEAD_LETTER.q, name="todo_dead_last_error"),
            # The admin's exact searches (migration 0019): owner:NAME, newest first, and key:K, whatever
            # the todo's state (todo_runnable_idempotency_key holds only runnable todos' keys). Both were
            # sequential scans at 1M rows (bench/admin/admin_changelist.py).
            models.Index(
                fields=["owner", "created_at"],
                condition=Q(owner__isnull=False),
                name="todo_admin_owner_recent",
            ),
            models.Index(fields=["idempotency_key"], condition=Q(idempotency_key__isnull=False), name="todo_admin_key"),
            # The dashboard's completions per minute over the last hour (todos/dashboard.py), and
            # retention's done todos past RETENTION_DONE_DAYS, oldest first (todos/retention.py).
            models.Index(fields=["completed_at"], condition=states.DONE.q, name="todo_done_recent"),
            # Dead-letters by when they failed: the dashboard's failures per minute (its retry-waiting part
            # reads todo_retry_due), retention's dead-letters past RETENTION_DEAD_DAYS and the event feed's
            # finished window. Dead-letters only (migration 0042): the claim's due-retry guard
            # (next_retry_at IS NOT NULL) can never imply this predicate, so on statistics taken with no
            # failed row the planner cannot serve the due branch from it and filter every dead-letter.
            models.Index(fields=["updated_at"], condition=states.DEAD_LETTER.q, name="todo_failed_recent"),
            # Retention's cancelled todos past RETENTION_CANCELLED_DAYS, and the dashboard's count of them.
            # queue included: the per-queue count is an index-only scan.
            models.Index(
                fields=["completed_at"], include=["queue"], condition=states.CANCELLED.q, name="todo_cancelled_recent"
            ),
            # queue_stats()'s waiting count and the admin's Waiting filter (state = waiting).
            models.Index(fields=["queue"], condition=states.WAITING.q, name="todo_waiting"),
            # The admin's free-text title search (title__icontains is UPPER(title) LIKE UPPER('%…%')):
            # a trigram index answers it in milliseconds at 1M rows instead of a sequential scan.
            # bench/admin/title_search.py measures both and its cost on transitions (docs/benchmarks.md).
            GinIndex(OpClass(Upper("title"), name="gin_trgm_ops"), name="todo_title_trgm"),
            # Lineage (issue 30). Partial: only children have entries, so a root (every todo created without
            # a parent) writes none, on create or on any later transition. A child pays two index tuples per
            # non-HOT update, as for any partial index that holds it.
            # A parent's children: the subtree walk of GET /todos/<id>/tree/ and the live-children count.
            models.Index(fields=["parent_id"], condition=Q(parent_id__isnull=False), name="todo_children"),
            # Cascades left unfinished (reap_once's step): a handful of rows at most.
            models.Index(fields=["id"], condition=Q(cascade__isnull=False), name="todo_cascade_pending"),
            # A root's descendants in tree order (depth, then id): a tree page and ?root= are one range.
            models.Index(fields=["root_id", "depth", "id"], condition=Q(root_id__isnull=False), name="todo_tree"),
        ]

    def __str__(self) -> str:
        return f"{self.id} [{self.queue}] {self.state}"

    @property
    def children_policy(self) -> str:
        """What its finish does to what is left under it: "cancel", or "keep" (stored as NULL)."""
        return self.children or "keep"

    @property
    def tree_root_id(self) -> str:
        """The root of this todo's tree: its own id for a root."""
        return self.root_id or self.id

    @property
    def tree_depth(self) -> int:
        return self.depth or 0

    @property
    def is_dead_letter(self) -> bool:
        return states.DEAD_LETTER.holds(self)

    @property
    def is_scheduled(self) -> bool:
        return states.SCHEDULED.holds(self)


class OnTimeout(models.TextChoices):
    # What a wait's timeout does: runnable again (resolution timed_out), or a failure that counts.
    PENDING = "pending", "pending"
    FAIL = "fail", "fail"


class Waitpoint(models.Model):
    """A todo's latest wait (issue 20): what resolves it, indexed for each kind of resolver while it is open,
    and its timeout. Whatever resolves it or times it out sets resolved_at and moves the todo, in one
    guarded statement (todos/sql/), so two resolvers of one wait cannot both win; the closed row stays so
    that a second resolve of a token is told apart (409) from an unknown token (404). A new wait of the
    same todo replaces its row. Not a foreign key: retention deletes todos in SQL. A wait whose todo left
    waiting another way (cancel) is closed by the next resolver or the timeout sweep, harmlessly."""

    todo_id = models.CharField(primary_key=True, max_length=40)
    queue = models.CharField(max_length=200)
    created_at = models.DateTimeField(db_default=Now())
    timeout_at = models.DateTimeField()
    on_timeout = models.CharField(max_length=10, choices=OnTimeout.choices, default=OnTimeout.PENDING)
    # for {"token": true}: SHA-256 of the token (hash_token), shown once to the waiter.
    token_hash = models.CharField(max_length=64, null=True, blank=True, unique=True)
    # for {"event": ...}: the source's slug, the type glob as a LIKE pattern, the whole match as a nested
    # object (checked by containment), and event_key: a hash of (source, one path, its value) that a
    # delivery computes for each of its scalar leaves, so matching is an index lookup per leaf, not a scan.
    event_source = models.CharField(max_length=100, null=True, blank=True)
    event_type_like = models.CharField(max_length=300, null=True, blank=True)
    event_match = models.JSONField(null=True, blank=True)
    event_key = models.CharField(max_length=32, null=True, blank=True)
    # for {"todos": [ids]}: nothing here but the timeout (the edges are Dependency rows, the count the
    # todo's dependencies_left).
    resolved_at = models.DateTimeField(null=True, blank=True)
    # Who waits (the agent that held the lease: it may never resolve its own wait), and whom the wait names
    # as its resolvers (issue 28, todos/waitpoints.py): exact agent names, and LIKE patterns (glob_to_like)
    # matched against a resolving agent's claim scopes. Both empty: only the token and operators.
    waiter = models.CharField(max_length=100, null=True, blank=True)
    # db_default: a statement written before these columns (a process of the previous release during a
    # deploy, a bench's raw insert) still makes a wait that names no resolvers.
    resolver_agents = ArrayField(models.CharField(max_length=100), db_default=Value([]), blank=True)
    resolver_scopes = ArrayField(models.CharField(max_length=300), db_default=Value([]), blank=True)
    # for {"people": ...} (issue 29, todos/people/): the question (title, body, decisions, edit_schema,
    # arguments, as asked, with the deciders' names), who may decide (user and group ids; the escalation
    # groups once escalated_at is set), when to remind and escalate (NULL: never), when that happened (each
    # once, by the reaper), and the username that decided (a loser of a race is told who won and when).
    people = models.JSONField(null=True, blank=True)
    decider_users = ArrayField(models.IntegerField(), db_default=Value([]), blank=True)
    decider_groups = ArrayField(models.IntegerField(), db_default=Value([]), blank=True)
    escalate_groups = ArrayField(models.IntegerField(), db_default=Value([]), blank=True)
    remind_at = models.DateTimeField(null=True, blank=True)
    escalate_at = models.DateTimeField(null=True, blank=True)
    reminded_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.CharField(max_length=150, null=True, blank=True)

    class Meta:
        # Each index but the last holds open waits only: closed ones cost the resolvers nothing.
        indexes = [
            # the reaper's remind_people / escalate_people: due reminders and escalations in order.
            models.Index(
                fields=["remind_at"],
                condition=Q(remind_at__isnull=False, reminded_at__isnull=True, resolved_at__isnull=True),
                name="waitpoint_remind_due",
            ),
            models.Index(
                fields=["escalate_at"],
                condition=Q(escalate_at__isnull=False, escalated_at__isnull=True, resolved_at__isnull=True),
                name="waitpoint_escalate_due",
            ),
            # the inbox: open waits for people, oldest first (few: each is a question to a person).
            models.Index(
                fields=["created_at"],
                condition=Q(people__isnull=False, resolved_at__isnull=True),
                name="waitpoint_open_people",
            ),
            # the reaper's time_out_waits: due timeouts in order.
            models.Index(fields=["timeout_at"], condition=Q(resolved_at__isnull=True), name="waitpoint_timeout"),
            # an ingest transaction's lookup, one probe per scalar leaf of the delivery's payload.
            models.Index(
                fields=["event_key"],
                condition=Q(event_key__isnull=False, resolved_at__isnull=True),
                name="waitpoint_event_key",
            ),
            # a wait's count of its agent's open event waits (MAX_OPEN_EVENT_WAITS_PER_AGENT).
            models.Index(
                fields=["waiter"],
                condition=Q(event_key__isnull=False, resolved_at__isnull=True),
                name="waitpoint_open_event_waiter",
            ),
            # MCP Events' wait.resolved (todos/event_feed.py): one waiter's closed waits by when. Written by a
            # resolve or a timeout only, never by a claim or a complete.
            models.Index(
                fields=["waiter", "resolved_at"], condition=Q(resolved_at__isnull=False), name="waitpoint_resolved"
            ),
        ]

    def __str__(self) -> str:
        return f"wait of {self.todo_id}"


class DecisionLink(models.Model):
    """A signed link to one decision (issue 29): bound to one wait (its todo and the wait's created_at, so a
    later wait of the same todo does not honour it) and one person, expiring, spent on first use. Only the
    SHA-256 of its random token is stored (hash_token). Using it lets that person decide that one wait
    without a login (a session flag scoped to the todo, todos/people/views.py), nothing else."""

    token_hash = models.CharField(primary_key=True, max_length=64)
    todo_id = models.CharField(max_length=40)
    wait_created_at = models.DateTimeField()
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # the reaper deletes expired links in order (todos/queue/people.py)
        indexes = [models.Index(fields=["expires_at"], name="decisionlink_expiry")]

    def __str__(self) -> str:
        return f"decision link for {self.todo_id}"


class Dependency(models.Model):
    """An open wait: ``dependent`` waits for ``dependency`` (issue 20), at ``position`` in its depends_on
    (made at create, todos/sql/ LINK) or in its wait's for.todos (``wait``: a holder's wait on todos,
    LINK_WAIT). Deleted by the statement that finishes the dependency, which settles the dependent
    (todos_settle_dependents): an edge settles once, so a dependency that dead-letters and is later
    completed by its slow worker settles nothing twice. Every wait also deletes the waiter's own edges
    left by an earlier wait (one that timed out or was resolved otherwise), so they count nothing off
    the new one. The table holds only open waits; the list itself is the dependent's depends_on or
    waiting_for. Plain ids, not foreign keys: retention deletes todos in SQL."""

    # Led by dependency_id: a finishing todo's open waits are one probe of the primary key (an empty
    # range for most todos).
    pk = models.CompositePrimaryKey("dependency_id", "dependent_id", "position")
    dependency_id = models.CharField(max_length=40)
    dependent_id = models.CharField(max_length=40)
    position = models.PositiveIntegerField()
    # A wait's edge resolves the waiter when every edge of it has settled, whatever each outcome; a create's
    # applies the dependent's on_dependency_failure to a dead-letter or a cancel.
    wait = models.BooleanField(db_default=False)

    class Meta:
        indexes = [
            # A wait's deletion of the waiter's edges of an earlier wait (todos/sql/waits.py: WAIT, LINK_WAIT),
            # an empty range for most todos. Partial: a create's edges are never left behind by a todo that
            # waits again (it became pending only once they had all settled), and do not pay for it.
            models.Index(fields=["dependent_id"], condition=Q(wait=True), name="dependency_waiter"),
        ]

    def __str__(self) -> str:
        return f"{self.dependent_id} waits for {self.dependency_id}"


class Queue(models.Model):
    """Every queue name ever used, and its controls. Claims expand agents' scope globs against this
    small table so that the claim scan can make one index lookup per concrete queue (SPEC trap 1); the
    same statement reads the controls, so every process obeys a change at its next claim.

    Written only by todos/controls.py (and the registering trigger of migration 0009)."""

    name = models.CharField(primary_key=True, max_length=200, validators=[validate_queue_name])
    created_at = models.DateTimeField(db_default=Now())
    # A paused queue hands out nothing; creates still land.
    paused = models.BooleanField(default=False, db_default=False)
    # At most this many live leases (claimed, not lapsed) at once; null: no cap.
    max_claimed = models.PositiveIntegerField(null=True, blank=True)
    # A token bucket: at most rate_per_second claims a second, in bursts of rate_burst; null: no limit.
    rate_per_second = models.FloatField(null=True, blank=True)
    rate_burst = models.PositiveIntegerField(null=True, blank=True)
    # The bucket's state, as of refilled_at (the claim refills it by the time elapsed, capped at the burst).
    tokens = models.FloatField(null=True, blank=True, editable=False)
    refilled_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Fair share (issue 22): claims take the todos' fair_keys in weighted round robin (weights from
    # fair_weights, default 1), at most max_claimed_per_key live leases per key.
    fair = models.BooleanField(default=False, db_default=False)
    fair_weights = models.JSONField(default=dict, db_default={}, blank=True)
    max_claimed_per_key = models.PositiveIntegerField(null=True, blank=True)
    # Issue 31: at most this many claims a second per fair_key (times the key's weight), a token bucket per key
    # (in todos_fairkey) of one second's burst; null: no per-key rate.
    rate_per_key = models.FloatField(null=True, blank=True)
    # The fair round (virtual time): the start of the last key a claim took. Kept by the claim statement.
    fair_round = models.FloatField(default=0.0, db_default=0.0, editable=False)
    # Spawn caps (issue 30) of the trees whose root is in this queue; null: no cap. max_depth: how far
    # below its root a todo may be; max_children: unfinished children of one parent at once;
    # max_descendants: todos ever created in one tree (its root excluded).
    max_depth = models.PositiveIntegerField(null=True, blank=True)
    max_children = models.PositiveIntegerField(null=True, blank=True)
    max_descendants = models.PositiveIntegerField(null=True, blank=True)
    # Named limits (issue 31) every todo of this queue is held by, beside its own (null: none).
    limits = ArrayField(models.TextField(), null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(rate_per_second__isnull=True)
                | Q(rate_per_second__gt=0, rate_burst__gte=1, tokens__isnull=False, refilled_at__isnull=False),
                name="queue_rate_limit_shape",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def limited(self) -> bool:
        return self.max_claimed is not None or self.rate_per_second is not None


class Limit(models.Model):
    """A named limit (issue 31), shared by every queue and todo that names it: at most max_claimed live leases
    of them at once, rate_per_second claims a second in bursts of rate_burst, and at most per_key live leases
    per fair_key (times the key's weight on its queue). Parked until parked_until (a provider's quota wall):
    it then lets nothing through, and its todos show ``blocked``. Enforced by the claim statements
    (todos/sql/flow.py), under this row's lock; written by todos/flow.py."""

    name = models.CharField(primary_key=True, max_length=100)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    max_claimed = models.PositiveIntegerField(null=True, blank=True)
    rate_per_second = models.FloatField(null=True, blank=True)
    rate_burst = models.PositiveIntegerField(null=True, blank=True)
    tokens = models.FloatField(null=True, blank=True, editable=False)
    refilled_at = models.DateTimeField(null=True, blank=True, editable=False)
    per_key = models.PositiveIntegerField(null=True, blank=True)
    parked_until = models.DateTimeField(null=True, blank=True)
    park_reason = models.CharField(max_length=500, blank=True, default="", db_default="")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(rate_per_second__isnull=True)
                | Q(rate_per_second__gt=0, rate_burst__gte=1, tokens__isnull=False, refilled_at__isnull=False),
                name="limit_rate_shape",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class FairKey(models.Model):
    """One fair queue's key and its pass (virtual time): the key's next claim starts at
    max(vtime, the queue's fair_round), and each claim adds 1/weight. Rows are written by the claim
    statement (CLAIM_NEXT) and registered by the todo table's trigger (migration 0016) when a key gets
    pending work on a fair queue; the claim deletes the rows of keys left with nothing pending."""

    pk = models.CompositePrimaryKey("queue", "key")
    queue = models.CharField(max_length=200)
    key = models.CharField(max_length=MAX_FAIR_KEY_CHARS)
    vtime = models.FloatField(default=0.0, db_default=0.0)
    # The key's token bucket on a queue with rate_per_key (issue 31), as of refilled_at; null: full.
    tokens = models.FloatField(null=True, blank=True)
    refilled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["queue", "vtime", "key"], name="fair_key_walk")]

    def __str__(self) -> str:
        return f"{self.queue}/{self.key}"


class FairReady(models.Model):
    """A pending todo of a fair queue already charged to its key's pass by a contended fair turn (issue 31): the
    next to claim, in (priority, tag) order, by CLAIM_FAIR_READY without the queue's lock (todos/sql/claim.py).
    The fair walk skips a todo with a row here. No foreign key: a row whose todo is gone or no longer claimable
    is deleted by the fast claim that meets it; set_limits deletes a queue's rows when it stops being eligible."""

    id = models.CharField(primary_key=True, max_length=40)  # the todo's
    queue = models.CharField(max_length=200)
    priority = models.SmallIntegerField()
    tag = models.FloatField()
    fair_key = models.CharField(max_length=MAX_FAIR_KEY_CHARS)

    class Meta:
        indexes = [models.Index(fields=["queue", "priority", "tag"], name="fair_ready_claim")]

    def __str__(self) -> str:
        return f"{self.queue}/{self.fair_key}/{self.id}"


def hash_token(token: str) -> str:
    # Tokens are 256-bit random strings, so one SHA-256 is enough: there is nothing to
    # brute-force that a slow hash would protect.
    return hashlib.sha256(token.encode()).hexdigest()


class Agent(models.Model):
    """A program that works on todos. Its name is the owner identity on its claims."""

    name = models.SlugField(max_length=100, unique=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="agents"
    )
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_prefix = models.CharField(max_length=12, editable=False, help_text="First characters, to recognise it.")
    claim_scopes = ArrayField(models.CharField(max_length=200, validators=[validate_scope]), default=list)
    create_scopes = ArrayField(models.CharField(max_length=200, validators=[validate_scope]), default=list)
    can_retry_dead_letters = models.BooleanField(default=False)
    # Pause, resume and limit queues (in its scopes) over the API: `create_agent --can-manage`.
    can_manage_queues = models.BooleanField(default=False)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(db_default=Now())
    # Signs the callbacks of the todos this agent creates (issue 29, Standard Webhooks ``whsec_``), so their
    # producer can verify them; shown by create_agent. Null until the agent first needs one.
    webhook_secret = models.CharField(max_length=100, null=True, blank=True, editable=False)

    def __str__(self) -> str:
        return self.name

    def set_new_token(self) -> str:
        """Give the agent a fresh token and return it; only its hash is stored."""
        token = f"sb_{secrets.token_urlsafe(32)}"
        self.token_hash = hash_token(token)
        self.token_prefix = token[:10]
        return token

    # Scopes as LIKE patterns (scope_like_patterns: none reaches a system queue unless it names one with a
    # literal leading "_").
    def claim_like_patterns(self) -> list[str]:
        return [p for s in self.claim_scopes for p in scope_like_patterns(s)]

    def create_like_patterns(self) -> list[str]:
        return [p for s in self.create_scopes for p in scope_like_patterns(s)]

    def visible_like_patterns(self) -> list[str]:
        return sorted({*self.claim_like_patterns(), *self.create_like_patterns()})

    def may_create_in(self, queue: str) -> bool:
        return scope_matches(self.create_scopes, queue)

    def may_claim_from(self, queue: str) -> bool:
        return scope_matches(self.claim_scopes, queue)

    def outside_claim_scopes(self, wanted: Iterable[str]) -> list[str]:
        """The names or globs in ``wanted`` that no claim scope covers and that cover no claim scope: a
        claim for them could never return anything. (Two globs that only partly overlap, such as
        ``gi*`` and ``*hub``, count as outside.)

        "Covers" reads the other glob as a name (its ``*`` and ``?`` as plain characters), so each test is
        one linear match (todos/globs.py), never a containment of one glob's language in another's. That is
        enough here: this is only an early 403 for a claim that could find nothing, and the claim statement
        itself takes a queue only when both the scopes and ``wanted`` match it (todos/sql/claim.py,
        _CALLERS), so no reading of "covers" can widen a claim."""
        return [
            w
            for w in wanted
            if not matches_any(self.claim_scopes, w) and not any(compile_glob(w).matches(s) for s in self.claim_scopes)
        ]


ALL_QUEUES = ["%"]  # the LIKE patterns that match every queue: the system's and an operator's view


def visible_patterns(agent: Agent | None) -> list[str]:
    """The one scope rule of reads and operator doors: the LIKE patterns of the queues ``agent`` may see
    (its claim and create scopes together). None is the system or an operator: every queue."""
    return agent.visible_like_patterns() if agent is not None else ALL_QUEUES


class CatchUp(models.TextChoices):
    # After downtime, which of the ticks that passed unseen get a todo: only the latest (no burst), none,
    # or all of them up to SCHEDULE_CATCH_UP_MAX (the most recent ones).
    LATEST = "latest", "latest"
    NONE = "none", "none"
    ALL = "all", "all"


SCHEDULE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def validate_schedule_name(value: str) -> None:
    if not SCHEDULE_NAME_RE.match(value or ""):
        raise ValidationError("Schedule names are 1-100 letters, digits and . _ -, starting with a letter or digit.")


def validate_cron(value: str) -> None:
    """A 5-field cron expression that cronsim can evaluate (minute hour day-of-month month day-of-week)."""
    from cronsim import CronSim, CronSimError

    if len((value or "").split()) != 5:
        raise ValidationError(f"{value!r} is not a 5-field cron expression (minute hour day month weekday).")
    try:
        CronSim(value, datetime.now(UTC))
    except CronSimError as exc:
        raise ValidationError(f"{value!r} is not a valid cron expression: {exc}.") from exc


def validate_timezone(value: str) -> None:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValidationError(f"{value!r} is not a known IANA time zone (e.g. Europe/Berlin, UTC).") from exc


class Schedule(models.Model):
    """A recurring todo: each tick of ``cron`` (in ``timezone``) makes one todo in ``queue``, created by the
    reapers exactly once per tick (todos/schedules.py)."""

    name = models.CharField(max_length=100, unique=True, validators=[validate_schedule_name])
    cron = models.CharField(max_length=200, validators=[validate_cron], help_text="5 fields, e.g. 30 2 * * *")
    timezone = models.CharField(max_length=64, default="UTC", validators=[validate_timezone])
    queue = models.CharField(max_length=200, validators=[validate_queue_name])
    kind = models.CharField(max_length=100, blank=True, default="")
    title = models.CharField(max_length=500, blank=True, default="")
    payload = models.JSONField(default=dict, blank=True)
    priority = models.SmallIntegerField(
        default=0, validators=[MinValueValidator(PRIORITY_MIN), MaxValueValidator(PRIORITY_MAX)]
    )
    fair_key = models.CharField(
        max_length=MAX_FAIR_KEY_CHARS, blank=True, default="", help_text="On a fair queue: whose share its todos take."
    )
    # Named limits (issue 31) its todos name; comma-separated in the admin.
    limits = ArrayField(
        models.CharField(max_length=100, validators=[validate_limit_name]),
        size=4,
        default=list,
        blank=True,
        help_text="Named limits its todos are held by (PUT /api/v1/limits/<name>/), e.g. openai.",
    )
    max_attempts = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="Empty: the queue's default."
    )
    is_active = models.BooleanField(default=True)
    catch_up = models.CharField(max_length=10, choices=CatchUp.choices, default=CatchUp.LATEST)
    created_at = models.DateTimeField(db_default=Now())
    # Kept by the reapers: the latest tick they have dealt with (made a todo for, or skipped by catch_up),
    # the first tick after it (null: work it out at the next sweep), and the last todo a tick made. A plain
    # id, not a foreign key: retention deletes todos in SQL.
    last_tick_at = models.DateTimeField(null=True, blank=True)
    next_tick_at = models.DateTimeField(null=True, blank=True)
    last_todo_id = models.CharField(max_length=40, null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX), name="schedule_priority_range"
            ),
            models.CheckConstraint(
                condition=Q(catch_up__in=[c.value for c in CatchUp]), name="schedule_catch_up_valid"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class LoginThrottle(models.Model):
    """Failed logins to the operator console, counted per user name and per client address
    (todos/admin/login.py). In PostgreSQL, not in a process's memory: every web process, and a restarted
    one, must see the same count, and the project has no shared cache."""

    # "user:<name, lowercased>" or "addr:<client address>".
    key = models.CharField(primary_key=True, max_length=300)
    failures = models.PositiveIntegerField()
    window_started_at = models.DateTimeField(db_index=True)
    locked_until = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return self.key


def new_webhook_secret() -> str:
    """A Standard Webhooks signing secret: ``whsec_`` and 32 random bytes in base64 (todos/notices.py)."""
    import base64

    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


class A2APushConfig(models.Model):
    """An A2A push notification config of a task (todos/a2a/push.py): where each change of the task's A2A
    state is POSTed as a StreamResponse, with the client's ``token`` in X-A2A-Notification-Token and its
    ``authentication`` as the Authorization header, signed too with the owning agent's webhook_secret. The
    todo is named, not a foreign key: a purge that deletes the todo leaves its configs, which send nothing
    (the trigger finds no todo to fire for)."""

    todo_id = models.CharField(max_length=40)
    config_id = models.CharField(max_length=100)
    agent_id = models.BigIntegerField()  # the agent that added it: its webhook_secret signs the deliveries
    url = models.CharField(max_length=2000)
    token = models.CharField(max_length=1000, blank=True, default="")
    auth_scheme = models.CharField(max_length=100, blank=True, default="")
    auth_credentials = models.CharField(max_length=1000, blank=True, default="")
    max_attempts = models.PositiveSmallIntegerField(default=8)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            # One config per (task, id); its index (todo_id first) is the trigger's lookup of a task's configs.
            models.UniqueConstraint(fields=["todo_id", "config_id"], name="a2a_push_config_one_per_id"),
        ]

    def __str__(self) -> str:
        return f"{self.todo_id}/{self.config_id}"


class NotifyEndpoint(models.Model):
    """Where a person's (or a group's) notices go besides email (issue 29): an HTTP receiver that gets each
    notice as a signed Standard Webhooks POST (todos/notices.py), e.g. a Slack or Teams bridge. Exactly one
    of ``user`` and ``group``. The URL is checked by the SSRF guard on save (check_outbound_url) and again
    on every send; the secret is shown once, when the admin creates it."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="notify_endpoints"
    )
    group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.CASCADE, related_name="notify_endpoints"
    )
    url = models.CharField(
        max_length=2000, help_text="http(s); checked against private addresses on save and on every send."
    )
    secret = models.CharField(max_length=100, default=new_webhook_secret, editable=False)
    active = models.BooleanField(default=True)
    # The notice events it wants (e.g. wait.asked, wait.reminder); empty: all of them.
    events = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(user__isnull=False, group__isnull=True) | Q(user__isnull=True, group__isnull=False),
                name="notify_endpoint_one_owner",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user or self.group} -> {self.url}"

    def wants(self, event: str) -> bool:
        return not self.events or event in self.events

    def clean(self) -> None:
        from todos.errors import InvalidTransitionInput
        from todos.notices import check_outbound_url

        if (self.user_id is None) == (self.group_id is None):
            raise ValidationError("An endpoint belongs to one user or one group.")
        try:
            check_outbound_url(self.url, field="url")
        except InvalidTransitionInput as exc:  # the API's 400 as a form error
            raise ValidationError({"url": str(exc)}) from exc


class EventSubscription(models.Model):
    """An agent's MCP Events webhook subscription (issue 33 item 2, ``events/subscribe``): durable, so the
    notify sidecar delivers across restarts, and TTL-scoped (``refresh_before``), so an abandoned one lapses.
    ``id`` is derived from the key (agent, url, name, arguments): a routing handle, never accepted as input.
    ``cursor`` is how far events have been handed to the sender (todos/notices.py): each is a delivery todo
    enqueued in the same transaction that moves the cursor, so nothing between two cursors is lost."""

    id = models.CharField(primary_key=True, max_length=40)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="event_subscriptions")
    name = models.CharField(max_length=100)
    arguments = models.JSONField(default=dict)
    url = models.CharField(max_length=2000)
    secret = models.CharField(max_length=200)
    cursor = models.CharField(max_length=200)
    refresh_before = models.DateTimeField()
    created_at = models.DateTimeField(db_default=Now())
    refreshed_at = models.DateTimeField(db_default=Now())
    last_delivery_at = models.DateTimeField(null=True, blank=True)
    # Secret rotation: the secret a refresh replaced, and when; deliveries are signed under both for
    # EVENTS_SECRET_ROTATION_GRACE_SECONDS after (signing_secrets).
    previous_secret = models.CharField(max_length=200, null=True, blank=True)
    secret_rotated_at = models.DateTimeField(null=True, blank=True)
    # Delivery health (the sketch's deliveryStatus): consecutive failed attempts, since when, the last
    # failure's category (never the endpoint's own answer), and whether delivery is suspended (active false,
    # after events_suspend_after_failures() failures; a refresh reactivates it).
    active = models.BooleanField(default=True)
    failures = models.PositiveIntegerField(default=0)
    failed_since = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=30, null=True, blank=True)

    class Meta:
        indexes = [
            # The sidecar's round and the lapse sweep: live subscriptions by expiry.
            models.Index(fields=["refresh_before"], name="event_subscription_expiry"),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id}: {self.name} -> {self.url}"

    def signing_secrets(self, now: datetime) -> list[str]:
        """The secrets its deliveries are signed under now: its own, and the one it replaced while in grace."""
        from todos.limits import EVENTS_SECRET_ROTATION_GRACE_SECONDS

        grace = timedelta(seconds=EVENTS_SECRET_ROTATION_GRACE_SECONDS)
        rotated = self.secret_rotated_at
        if self.previous_secret and rotated is not None and now - rotated < grace:
            return [self.secret, self.previous_secret]
        return [self.secret]
