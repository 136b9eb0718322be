"""A small pure-Python model of the todo state machine: SPEC.md's transition table and decisions,
written without SQL, for test_queue_model.py to run beside the real queue.

Time is abstract. Nothing lapses or falls due by itself (leases are long, retries and scheduled run_at
far off); the test ages a lease, a retry or a scheduled todo explicitly, and the model records the order
of those agings, which is the order of the database timestamps they set. ``run_order`` stands for
run_at: the creation tick, or the tick at which a scheduled todo was made due or run now.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

OK, NOT_FOUND, CONFLICT = "ok", "not_found", "conflict"

# Outcome of a model transition: (class, todo) where class is OK, NOT_FOUND or CONFLICT.
Outcome = tuple[str, "ModelTodo | None"]


@dataclass
class ModelAgent:
    name: str
    scopes: list[str]  # claim and create scopes alike

    def sees(self, queue: str) -> bool:
        # Scopes are globs of * and ? only; queue names in the model contain no [ ] for fnmatch to misread.
        return any(fnmatch.fnmatchcase(queue, s) for s in self.scopes)


@dataclass
class ModelTodo:
    id: str
    seq: int  # creation order = created_at order
    queue: str
    key: str | None
    assignee: str | None
    max_attempts: int
    state: str = "pending"
    priority: int = 0
    run_order: int = 0
    due_now: bool = False  # scheduled only: run_at has come
    attempt: int = 0
    retry: str | None = None  # failed only: None = dead-letter, "waiting", "due"
    lapsed: bool = False  # claimed only: lease_expires_at in the past
    lapse_order: int = 0
    due_order: int = 0
    owner: str | None = None
    lease: str | None = None  # the current receipt
    errors: int = 0
    left: int = 0  # waiting on dependencies: how many are not settled yet
    policy: str = "cancel"  # on_dependency_failure

    @property
    def dead(self) -> bool:
        return self.state == "failed" and self.retry is None

    @property
    def runnable(self) -> bool:
        """Holds its idempotency key (SPEC decision 3)."""
        live = ("pending", "claimed", "scheduled", "waiting")
        return self.state in live or (self.state == "failed" and self.retry is not None)

    @property
    def claim_order(self) -> tuple[int, int]:
        return (self.priority, self.run_order)


@dataclass
class QueueModel:
    todos: dict[str, ModelTodo] = field(default_factory=dict)
    queues: set[str] = field(default_factory=set)
    clock: int = 0  # orders creations and agings
    # Open dependency edges: a dependency's id -> the dependents still waiting on it (one entry per edge).
    waits: dict[str, list[str]] = field(default_factory=dict)

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    # --- reads -------------------------------------------------------------------------------
    def key_holder(self, queue: str, key: str | None, *, besides: str | None = None) -> ModelTodo | None:
        if key is None:
            return None
        for t in self.todos.values():
            if t.id != besides and t.queue == queue and t.key == key and t.runnable:
                return t
        return None

    def claimable(self, t: ModelTodo, agent: ModelAgent) -> bool:
        if t.assignee not in (None, agent.name):
            return False
        return (
            t.state == "pending"
            or (t.state == "claimed" and t.lapsed and t.attempt < t.max_attempts)
            or (t.state == "failed" and t.retry == "due")
            or (t.state == "scheduled" and t.due_now)
        )

    def _miss(self, t: ModelTodo | None, agent: ModelAgent | None) -> Outcome:
        if t is None or (agent is not None and not agent.sees(t.queue)):
            return NOT_FOUND, None
        return CONFLICT, t

    def _revives_key(self, t: ModelTodo, becomes_runnable: bool) -> bool:
        """A dead or done todo made runnable again clashes with a newer runnable holder of its key."""
        return becomes_runnable and not t.runnable and self.key_holder(t.queue, t.key, besides=t.id) is not None

    # --- transitions -------------------------------------------------------------------------
    def create(
        self,
        todo_id: str,
        queue: str,
        key: str | None,
        assignee: str | None,
        max_attempts: int,
        priority: int = 0,
        scheduled: bool = False,
    ) -> tuple[ModelTodo, bool]:
        """(the todo, created): an existing runnable holder of the key is returned instead of a new one."""
        self.queues.add(queue)
        holder = self.key_holder(queue, key)
        if holder is not None:
            return holder, False
        seq = self.tick()
        t = ModelTodo(todo_id, seq, queue, key, assignee, max_attempts, priority=priority, run_order=seq)
        if scheduled:
            t.state = "scheduled"
            t.run_order = 10**9 + seq  # far ahead: later than anything until it is made due
        self.todos[todo_id] = t
        return t, True

    def create_depending(
        self, todo_id: str, queue: str, key: str | None, depends_on: list[str], policy: str
    ) -> tuple[ModelTodo, bool]:
        """create with depends_on: waiting on each dependency (a duplicate counts once), which the ones
        already finished settle at once; an existing runnable holder of the key is returned instead."""
        holder = self.key_holder(queue, key)
        if holder is not None:
            self.queues.add(queue)
            return holder, False
        t, _ = self.create(todo_id, queue, key, None, 2)
        deps = list(dict.fromkeys(depends_on))
        t.state, t.left, t.policy = "waiting", len(deps), policy
        for dep in deps:
            self.waits.setdefault(dep, []).append(t.id)
        self.settle([d for d in deps if self.finished(self.todos[d])])
        return t, True

    @staticmethod
    def finished(t: ModelTodo) -> bool:
        return t.state in ("done", "cancelled") or t.dead

    def settle(self, finished: list[str]) -> None:
        """What the statement that finished these todos does to their dependents: each waiting one counts
        the dependency off; a dead or cancelled one cancels a dependent whose policy is cancel (whose own
        dependents then settle too); the last one makes it pending. Each edge settles once."""
        while finished:
            cancelled: list[str] = []
            for dep in finished:
                for dependent_id in self.waits.pop(dep, []):
                    d = self.todos[dependent_id]
                    if d.state != "waiting" or d.left <= 0:
                        continue
                    d.left -= 1
                    if self.todos[dep].state != "done" and d.policy == "cancel":
                        d.state, d.errors = "cancelled", d.errors + 1
                        cancelled.append(d.id)
                    elif d.left == 0:
                        d.state = "pending"
            finished = cancelled

    def choose_next(self, agent: ModelAgent, wanted: list[str] | None, limit: int) -> list[ModelTodo]:
        """Which todos claim_next takes: per queue the first pending in claim order (priority, then
        run_at) and the earliest-due scheduled, plus the earliest-lapsed leases and the earliest-due
        retries (each branch capped at ``limit``), then the first ``limit`` of those in claim order."""
        queues = {q for q in self.queues if agent.sees(q) and (wanted is None or q in wanted)}
        mine = [t for t in self.todos.values() if t.queue in queues and self.claimable(t, agent)]
        candidates: list[ModelTodo] = []
        for q in queues:
            here = [t for t in mine if t.queue == q]
            candidates += sorted((t for t in here if t.state == "pending"), key=lambda t: t.claim_order)[:limit]
            candidates += sorted((t for t in here if t.state == "scheduled"), key=lambda t: t.run_order)[:limit]
        candidates += sorted((t for t in mine if t.state == "claimed"), key=lambda t: t.lapse_order)[:limit]
        candidates += sorted((t for t in mine if t.state == "failed"), key=lambda t: t.due_order)[:limit]
        return sorted(candidates, key=lambda t: t.claim_order)[:limit]

    def take(self, t: ModelTodo, agent: ModelAgent, lease: str) -> None:
        if t.state == "claimed":  # a lapsed lease re-claimed before the reaper saw it
            t.errors += 1
        t.state, t.attempt, t.owner, t.lease = "claimed", t.attempt + 1, agent.name, lease
        t.lapsed, t.retry, t.due_now = False, None, False

    def claim(self, todo_id: str, agent: ModelAgent) -> Outcome:
        t = self.todos.get(todo_id)
        if t is None or not agent.sees(t.queue) or not self.claimable(t, agent):
            return self._miss(t, agent)
        return OK, t  # the caller applies take() with the lease the database issued

    def with_receipt(self, verb: str, todo_id: str, agent: ModelAgent, lease: str) -> Outcome:
        t = self.todos.get(todo_id)
        if t is None or not agent.sees(t.queue):
            return NOT_FOUND, None
        if t.lease != lease or t.owner != agent.name or t.state not in ("claimed", "pending", "failed"):
            return CONFLICT, t
        # A lease the reaper dead-lettered at its cap may still be completed or failed (SPEC decision 2)
        # but never taken back or handed back: only an operator revives a dead-letter (decision 1).
        if t.dead and verb in ("heartbeat", "release"):
            return CONFLICT, t
        if verb == "heartbeat":
            if self._revives_key(t, True):
                return CONFLICT, t
            t.state, t.lapsed, t.retry = "claimed", False, None
        elif verb == "complete":
            t.state, t.lease, t.lapsed, t.retry = "done", None, False, None
            self.settle([t.id])
        elif verb == "fail":
            retry = "waiting" if t.attempt < t.max_attempts else None
            if self._revives_key(t, retry is not None):
                return CONFLICT, t
            t.state, t.retry, t.lease, t.lapsed, t.errors = "failed", retry, None, False, t.errors + 1
            if t.dead:
                self.settle([t.id])
        elif verb == "release":
            if self._revives_key(t, True):
                return CONFLICT, t
            t.state, t.attempt, t.lease = "pending", max(t.attempt - 1, 0), None
            t.lapsed, t.retry = False, None
        else:  # pragma: no cover
            raise ValueError(verb)
        return OK, t

    def retry_dead_letter(self, todo_id: str, mode: str, agent: ModelAgent | None) -> Outcome:
        t = self.todos.get(todo_id)
        if t is None or (agent is not None and not agent.sees(t.queue)) or not t.dead:
            return self._miss(t, agent)
        if self._revives_key(t, True):
            return CONFLICT, t
        if mode == "reset":
            t.attempt = 0
        else:
            t.max_attempts = max(t.max_attempts, t.attempt + 1)
        t.state, t.lease, t.retry, t.errors = "pending", None, None, t.errors + 1
        return OK, t

    def cancel(self, todo_id: str, agent: ModelAgent | None) -> Outcome:
        """pending, scheduled, waiting, claimed (lapsed or not) or retry-waiting -> cancelled; the receipt is
        revoked."""
        t = self.todos.get(todo_id)
        cancellable = t is not None and (
            t.state in ("pending", "scheduled", "claimed", "waiting") or (t.state == "failed" and t.retry is not None)
        )
        if t is None or (agent is not None and not agent.sees(t.queue)) or not cancellable:
            return self._miss(t, agent)
        t.state, t.lease, t.retry, t.lapsed, t.errors = "cancelled", None, None, False, t.errors + 1
        self.settle([t.id])
        return OK, t

    def run_now(self, todo_id: str) -> Outcome:
        t = self.todos.get(todo_id)
        if t is None or t.state != "scheduled":
            return self._miss(t, None)
        t.state, t.run_order, t.due_now, t.errors = "pending", self.tick(), False, t.errors + 1
        return OK, t

    def set_priority(self, todo_id: str, priority: int) -> Outcome:
        t = self.todos.get(todo_id)
        if t is None or t.state not in ("pending", "scheduled"):
            return self._miss(t, None)
        t.priority = priority
        return OK, t

    def make_scheduled_due(self, t: ModelTodo) -> None:
        t.due_now, t.run_order = True, self.tick()

    def lapse(self, t: ModelTodo) -> None:
        t.lapsed, t.lapse_order = True, self.tick()

    def make_due(self, t: ModelTodo) -> None:
        t.retry, t.due_order = "due", self.tick()

    def reap(self) -> tuple[int, int, int, int]:
        requeued = dead = promoted = scheduled = 0
        for t in self.todos.values():
            if t.state == "claimed" and t.lapsed:
                t.errors += 1
                t.lapsed = False
                if t.attempt < t.max_attempts:
                    t.state, requeued = "pending", requeued + 1
                else:
                    t.state, t.retry, dead = "failed", None, dead + 1
                    self.settle([t.id])
        for t in self.todos.values():
            if t.state == "failed" and t.retry == "due":
                t.state, t.retry, promoted = "pending", None, promoted + 1
        for t in self.todos.values():
            if t.state == "scheduled" and t.due_now:
                t.state, t.due_now, scheduled = "pending", False, scheduled + 1
        return requeued, dead, promoted, scheduled
