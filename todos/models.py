"""The todo, its states, the agents that work on todos, and the registry of queue names."""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now

QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$")
SCOPE_RE = re.compile(r"^[A-Za-z0-9._:/*?-]{1,200}$")


def new_todo_id() -> str:
    return f"td_{uuid.uuid4().hex}"


def validate_queue_name(value: str) -> None:
    if not QUEUE_NAME_RE.match(value or ""):
        raise ValidationError(
            "Queue names are 1-200 characters of letters, digits and . _ : / -, starting with a letter or digit."
        )


def validate_scope(value: str) -> None:
    if not SCOPE_RE.match(value or ""):
        raise ValidationError("A scope is a queue name or a glob using * and ?, e.g. github.*")


def glob_to_like(pattern: str) -> str:
    """Turn a scope glob (``*`` and ``?`` only) into a SQL LIKE pattern with ``\\`` as the escape."""
    escaped = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%").replace("?", "_")


@models.CharField.register_lookup
class LikeAny(models.Lookup):
    """``queue__like_any=[patterns]`` → ``queue LIKE ANY(patterns)``: the scope filter on every query."""

    lookup_name = "like_any"
    prepare_rhs = False

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        return f"{lhs} LIKE ANY(%s::text[])", [*lhs_params, list(self.rhs)]


class TodoState(models.TextChoices):
    # Entered by create, release, a lapsed lease below the cap (reaper), a due retry
    # (retry scheduler) and operator retry. Left by claim.
    PENDING = "pending", "pending"
    # Entered by claim (also of a lapsed lease or a due retry). Left by complete, fail,
    # release, or the lease lapsing.
    CLAIMED = "claimed", "claimed"
    # Terminal. Entered by complete (or an operator's discard).
    DONE = "done", "done"
    # Entered by fail and by a lapsed lease at the cap. With next_retry_at set it waits for
    # a retry (left by the retry scheduler or a claim once due); with next_retry_at null it
    # is a dead-letter, left only by operator retry.
    FAILED = "failed", "failed"
    # Entered by create with a future run_at (or a delay). Left by a claim once run_at has passed (the
    # claim scan sees due ones at once), by the reaper's promotion to pending, or by an operator's run now
    # (or discard).
    SCHEDULED = "scheduled", "scheduled"


# --- Scheduling vocabulary (issue 12). Fold into the vocabulary module (todos/states.py) at merge; every
# other Python use of these conditions refers to these names. The SQL forms are in todos/sql.py's block of
# the same name.
PRIORITY_MIN, PRIORITY_MAX = -100, 100  # lower runs first (Graphile Worker's convention)
MAX_DELAY_SECONDS = 365 * 24 * 3600  # how far ahead run_at / delay_seconds may reach
# scheduled and due: claimable by the claim scan, promoted to pending by the reaper.
SCHEDULED_DUE = Q(state=TodoState.SCHEDULED, run_at__lte=Now())
# The todos that can still run hold their idempotency key (SPEC decision 3); scheduled ones included.
RUNNABLE = Q(state__in=[TodoState.PENDING, TodoState.CLAIMED, TodoState.SCHEDULED]) | Q(
    state=TodoState.FAILED, next_retry_at__isnull=False
)
# Operators may change the priority of, or run now, only what has not started.
PRIORITY_CHANGEABLE_STATES = (TodoState.PENDING, TodoState.SCHEDULED)


class TodoQuerySet(models.QuerySet["Todo"]):
    def visible_to(self, agent: Agent) -> TodoQuerySet:
        """Todos in the queues the agent may see (its claim and create scopes)."""
        return self.filter(queue__like_any=agent.visible_like_patterns())

    def dead_lettered(self) -> TodoQuerySet:
        return self.filter(state=TodoState.FAILED, next_retry_at__isnull=True)

    def retry_waiting(self) -> TodoQuerySet:
        return self.filter(state=TodoState.FAILED, next_retry_at__isnull=False)

    def lapsed(self) -> TodoQuerySet:
        return self.filter(state=TodoState.CLAIMED, lease_expires_at__lt=Now())

    def retry_due(self) -> TodoQuerySet:
        return self.filter(state=TodoState.FAILED, next_retry_at__lte=Now())

    def runnable(self) -> TodoQuerySet:
        return self.filter(RUNNABLE)


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

    objects = TodoQuerySet.as_manager()

    class Meta:
        constraints = [
            # SPEC decision 3: every todo that can still run holds its key; done and
            # dead-lettered todos free it. todos/sql.py's INSERT ... ON CONFLICT names
            # this exact predicate.
            models.UniqueConstraint(
                fields=["queue", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False) & RUNNABLE,
                name="todo_runnable_idempotency_key",
            ),
            models.CheckConstraint(condition=Q(attempt__gte=0), name="todo_attempt_not_negative"),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="todo_max_attempts_positive"),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX), name="todo_priority_range"
            ),
        ]
        indexes = [
            # claim_next, pending branch: one index descent per queue, in claim order (priority, then run_at).
            # run_at NULLS FIRST (the column is never null) so that this stays the only index that yields
            # CLAIM_NEXT's order, whatever indexes the admin gains (todos/sql.py, migrations 0007 and 0012).
            models.Index(
                F("queue"),
                F("priority"),
                F("run_at").asc(nulls_first=True),
                condition=Q(state="pending"),
                name="todo_pending_claim_scan",
            ),
            # claim_next's and the reaper's scheduled-due branches, and the long-poll's next wake: per queue
            # a range run_at <= now() that stops at the first future row, so a claim never walks the future
            # (Procrastinate filters its scheduled_at after the index and re-walks them on every fetch).
            models.Index(fields=["queue", "run_at"], condition=Q(state="scheduled"), name="todo_scheduled_due"),
            # requeue_lapsed and claim_next's lapsed-lease branch: lapsed leases in expiry order.
            models.Index(fields=["lease_expires_at"], condition=Q(state="claimed"), name="todo_claimed_lease_expiry"),
            # promote_due_retries and claim_next's due-retry branch.
            models.Index(
                fields=["next_retry_at"],
                condition=Q(state="failed", next_retry_at__isnull=False),
                name="todo_retry_due",
            ),
            # Dead-letter triage (admin filter, API dead=true, queue counts).
            models.Index(
                fields=["queue", "updated_at"],
                condition=Q(state="failed", next_retry_at__isnull=True),
                name="todo_dead_letters",
            ),
            # An event's todos (the FK's PROTECT check, the event admin, replay). Partial: todos that
            # agents create have no event, and a full index would take a write on every transition.
            models.Index(fields=["event"], condition=Q(event__isnull=False), name="todo_event"),
            # The admin's changelist (todos/admin.py) lists newest first, unfiltered or by one filter.
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
            # The dashboard's completions per minute over the last hour (todos/dashboard.py), and
            # retention's done todos past RETENTION_DONE_DAYS, oldest first (todos/retention.py).
            models.Index(fields=["completed_at"], condition=Q(state="done"), name="todo_done_recent"),
            # The dashboard's failures per minute (failed rows by when they last changed), and
            # retention's dead-letters past RETENTION_DEAD_DAYS (retry-waiting rows are few: a filter).
            models.Index(fields=["updated_at"], condition=Q(state="failed"), name="todo_failed_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.id} [{self.queue}] {self.state}"

    @property
    def is_dead_letter(self) -> bool:
        return self.state == TodoState.FAILED and self.next_retry_at is None

    @property
    def is_scheduled(self) -> bool:
        return self.state == TodoState.SCHEDULED


class Queue(models.Model):
    """Every queue name ever used. Claims expand agents' scope globs against this small table
    so that the claim scan can make one index lookup per concrete queue (SPEC trap 1)."""

    name = models.CharField(primary_key=True, max_length=200, validators=[validate_queue_name])
    created_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return self.name


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
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return self.name

    def set_new_token(self) -> str:
        """Give the agent a fresh token and return it; only its hash is stored."""
        token = f"sb_{secrets.token_urlsafe(32)}"
        self.token_hash = hash_token(token)
        self.token_prefix = token[:10]
        return token

    def claim_like_patterns(self) -> list[str]:
        return [glob_to_like(s) for s in self.claim_scopes]

    def create_like_patterns(self) -> list[str]:
        return [glob_to_like(s) for s in self.create_scopes]

    def visible_like_patterns(self) -> list[str]:
        return sorted({*self.claim_like_patterns(), *self.create_like_patterns()})

    def may_create_in(self, queue: str) -> bool:
        return _glob_matches(self.create_scopes, queue)

    def may_claim_from(self, queue: str) -> bool:
        return _glob_matches(self.claim_scopes, queue)


def _glob_matches(scopes: Iterable[str], queue: str) -> bool:
    # Same meaning as glob_to_like: * any run, ? one character, nothing else special.
    for scope in scopes:
        regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in scope)
        if re.fullmatch(regex, queue):
            return True
    return False


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
