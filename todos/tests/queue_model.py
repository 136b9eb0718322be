"""A small pure-Python model of the todo state machine: SPEC.md's transition table and decisions,
written without SQL, for test_queue_model.py to run beside the real queue.

Time is abstract. Nothing lapses or falls due by itself (leases are long, retries and scheduled run_at
far off); the test ages a lease, a retry or a scheduled todo explicitly, and the model records the order
of those agings, which is the order of the database timestamps they set. ``run_order`` stands for
run_at: the creation tick, or the tick at which a scheduled todo was made due or run now.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from dataclasses import dataclass, field

OK, NOT_FOUND, CONFLICT, FORBIDDEN = "ok", "not_found", "conflict", "forbidden"

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
    fair_key: str = ""
    deps_left: int = 0  # waiting on dependencies made at create: how many are not settled yet
    policy: str = "cancel"  # on_dependency_failure
    # waiting only (issue 20): what for ("token" or "todos"), the awaited todos not finished yet, what a
    # timeout does, and whether the test has made its timeout pass.
    waits: str | None = None
    left: set[str] = field(default_factory=set)
    on_timeout: str = "pending"
    timeout_due: bool = False

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

    @property
    def finished(self) -> bool:
        """What a wait on todos waits for: done, cancelled or dead-lettered."""
        return self.state in ("done", "cancelled") or self.dead


@dataclass
class QueueModel:
    todos: dict[str, ModelTodo] = field(default_factory=dict)
    queues: set[str] = field(default_factory=set)
    clock: int = 0  # orders creations and agings
    # Fair share (issue 22): the fair queues, each registered key's pass, each fair queue's round.
    fair: set[str] = field(default_factory=set)
    passes: dict[tuple[str, str], float] = field(default_factory=dict)
    rounds: dict[str, float] = field(default_factory=dict)
    # Open dependency edges: a dependency's id -> the dependents still waiting on it (one entry per edge).
    dep_waits: dict[str, list[str]] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)  # a token wait's token -> its todo (latest wait only)

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
        fair_key: str = "",
    ) -> tuple[ModelTodo, bool]:
        """(the todo, created): an existing runnable holder of the key is returned instead of a new one."""
        self.queues.add(queue)
        holder = self.key_holder(queue, key)
        if holder is not None:
            return holder, False
        seq = self.tick()
        t = ModelTodo(todo_id, seq, queue, key, assignee, max_attempts, priority=priority, run_order=seq)
        t.fair_key = fair_key
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
        t.state, t.deps_left, t.policy = "waiting", len(deps), policy
        for dep in deps:
            self.dep_waits.setdefault(dep, []).append(t.id)
        for dep in deps:
            if self.todos[dep].finished:
                self.settle(self.todos[dep])
        return t, True

    def settle(self, t: ModelTodo) -> None:
        """What the statement that finished ``t`` does to its dependents (made at create): each waiting one
        counts it off; if it is dead or cancelled, one whose policy is cancel is cancelled (and finishes in
        turn); the last one makes it pending. Each edge settles once."""
        for dependent_id in self.dep_waits.pop(t.id, []):
            d = self.todos[dependent_id]
            if d.state != "waiting" or d.deps_left <= 0:
                continue
            d.deps_left -= 1
            if t.state != "done" and d.policy == "cancel":
                d.state, d.errors = "cancelled", d.errors + 1
                self.finished(d)
            elif d.deps_left == 0:
                d.state = "pending"

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
        if not queues & self.fair:
            return sorted(candidates, key=lambda t: t.claim_order)[:limit]
        return self._choose_fair(agent, queues, mine, candidates, limit)

    def _start(self, queue: str, key: str) -> float:
        return max(self.passes.get((queue, key), 0.0), self.rounds.get(queue, 0.0))

    def _choose_fair(
        self, agent: ModelAgent, queues: set[str], mine: list[ModelTodo], candidates: list[ModelTodo], limit: int
    ) -> list[ModelTodo]:
        """CLAIM_NEXT_FAIR with a fair queue among the caller's (weights 1, no caps; concurrent claimers take
        turns on the queue's row, so each claim is this one on the state its predecessor left): a fair queue's
        pending todos come from the walk (keys in (pass, key) order with pending work at the queue's top
        priority, the first ``limit`` of them, up to ``limit`` todos each); every candidate of a fair queue's
        key is tagged start + (its place among the key's candidates in claim order) (issue 31: a batch takes
        the lowest tags, as many from one key as they win); candidates go by (priority, fair before plain,
        tag, run order). Key state moves as the statement's."""
        held: dict[tuple[str, str], float] = {}  # (queue, key) -> start
        for t in self.todos.values():  # the triggers register every key that gets pending work
            if t.queue in self.fair and t.state == "pending":
                self.passes.setdefault((t.queue, t.fair_key), 0.0)
        snapshot = dict(self.passes)  # what the statement's own reads see
        for q in queues & self.fair:
            pending = [t for t in mine if t.queue == q and t.state == "pending"]
            candidates = [t for t in candidates if not (t.queue == q and t.state == "pending")]
            if pending:
                top = min(pending, key=lambda t: t.claim_order).priority
                keys = sorted(
                    {t.fair_key for t in pending if t.priority == top}, key=lambda k: (self.passes[(q, k)], k)
                )[:limit]
                for k in keys:
                    held[(q, k)] = self._start(q, k)
                    candidates += sorted((t for t in pending if t.fair_key == k), key=lambda t: t.claim_order)[:limit]
        for t in candidates:  # lapsed, due and scheduled todos of a fair queue: their keys are locked too
            if t.queue in self.fair and (t.queue, t.fair_key) not in held:
                self.passes.setdefault((t.queue, t.fair_key), 0.0)
                held[(t.queue, t.fair_key)] = self._start(t.queue, t.fair_key)
        # the j-th candidate of a key (in claim order) is tagged start + j - 1; at most ``limit`` per key
        nth: dict[tuple[str, str], int] = {}
        ranked: list[tuple[int, int, float, int, ModelTodo]] = []
        for t in sorted(candidates, key=lambda t: t.claim_order):
            if t.queue in self.fair:
                qk = (t.queue, t.fair_key)
                nth[qk] = nth.get(qk, 0) + 1
                if nth[qk] <= limit:
                    ranked.append((t.priority, 0, held[qk] + nth[qk] - 1, t.run_order, t))
            else:
                ranked.append((t.priority, 1, 0.0, t.run_order, t))
        chosen = [r[-1] for r in sorted(ranked, key=lambda r: r[:4])[:limit]]
        self._fair_after(queues, held, chosen, snapshot)
        return sorted(chosen, key=lambda t: t.claim_order)  # as queue.claim_next hands them back

    def _fair_after(
        self,
        queues: set[str],
        held: dict[tuple[str, str], float],
        chosen: list[ModelTodo],
        snapshot: dict[tuple[str, str], float],
    ) -> None:
        old_rounds = {q: self.rounds.get(q, 0.0) for q in queues & self.fair}
        counts = Counter((t.queue, t.fair_key) for t in chosen if t.queue in self.fair)
        taken = set(counts)
        for qk in taken:
            if qk in snapshot:  # a key the statement registered itself keeps pass 0 (an UPDATE cannot see it)
                self.passes[qk] = held[qk] + counts[qk]
        for q in queues & self.fair:
            starts = [held[qk] for qk in taken if qk[0] == q]
            if starts and min(starts) >= old_rounds[q] + 1:
                self.rounds[q] = min(starts)
            # the claim forgets the keys among the 8 lowest below the round (as its snapshot saw them) that
            # it did not hold and that have nothing pending
            lowest = sorted(
                (k for (qq, k), v in snapshot.items() if qq == q and v <= old_rounds[q]),
                key=lambda k: (snapshot[(q, k)], k),
            )[:8]
            for k in lowest:
                if (q, k) not in held and not any(
                    t.queue == q and t.fair_key == k and t.state == "pending" for t in self.todos.values()
                ):
                    del self.passes[(q, k)]

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
            self.finished(t)
        elif verb == "fail":
            retry = "waiting" if t.attempt < t.max_attempts else None
            if self._revives_key(t, retry is not None):
                return CONFLICT, t
            t.state, t.retry, t.lease, t.lapsed, t.errors = "failed", retry, None, False, t.errors + 1
            self.finished(t)
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
        t.waits, t.left = None, set()
        self.finished(t)
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
                    self.finished(t)
        for t in self.todos.values():
            if t.state == "failed" and t.retry == "due":
                t.state, t.retry, promoted = "pending", None, promoted + 1
        for t in self.todos.values():
            if t.state == "scheduled" and t.due_now:
                t.state, t.due_now, scheduled = "pending", False, scheduled + 1
        timed_out = 0
        for t in sorted(self.todos.values(), key=lambda t: t.seq):
            if t.state == "waiting" and t.timeout_due:
                timed_out += 1
                t.waits, t.left, t.timeout_due, t.errors = None, set(), False, t.errors + 1
                if t.on_timeout == "pending":
                    t.state = "pending"
                else:
                    t.attempt += 1
                    t.state, t.retry = "failed", ("waiting" if t.attempt < t.max_attempts else None)
                    self.finished(t)
        return requeued, dead, promoted, scheduled, timed_out

    # --- waits (issue 20) ----------------------------------------------------------------------
    def finished(self, t: ModelTodo) -> None:
        """``t`` has just finished (or failed below the cap: then nothing): each todo waiting for it takes
        it off what it waits for, and one left with nothing is pending again."""
        if not t.finished:
            return
        for w in self.todos.values():
            if w.state == "waiting" and w.waits == "todos" and t.id in w.left:
                w.left.discard(t.id)
                if not w.left:
                    self._resolve(w)
        self.settle(t)

    def _resolve(self, t: ModelTodo) -> None:
        t.state, t.waits, t.left, t.timeout_due, t.errors = "pending", None, set(), False, t.errors + 1

    def wait(
        self,
        todo_id: str,
        agent: ModelAgent,
        lease: str,
        kind: str,
        awaited: list[str],
        token: str | None,
        on_timeout: str,
    ) -> Outcome:
        """claimed (or pending with its lapsed receipt) -> waiting, the attempt given back; a wait on todos
        that have all finished is resolved at once. Awaited todos the agent cannot see: not found."""
        if kind == "todos" and any(a not in self.todos or not agent.sees(self.todos[a].queue) for a in awaited):
            return NOT_FOUND, None
        t = self.todos.get(todo_id)
        if t is None or not agent.sees(t.queue):
            return NOT_FOUND, None
        if t.lease != lease or t.owner != agent.name or t.state not in ("claimed", "pending") or t.dead:
            return CONFLICT, t
        self.tokens = {k: v for k, v in self.tokens.items() if v != todo_id}  # a new wait replaces the last
        if token is not None:
            self.tokens[token] = todo_id
        t.state, t.attempt, t.lease, t.lapsed, t.retry = "waiting", max(t.attempt - 1, 0), None, False, None
        t.waits, t.on_timeout, t.timeout_due, t.errors = kind, on_timeout, False, t.errors + 1
        t.left = {a for a in awaited if not self.todos[a].finished} if kind == "todos" else set()
        if kind == "todos" and not t.left:
            self._resolve(t)
        return OK, t

    def resolve(self, todo_id: str, agent: ModelAgent | None) -> Outcome:
        t = self.todos.get(todo_id)
        # A todo waiting on the dependencies it was created with has no wait to resolve: a conflict.
        if t is None or (agent is not None and not agent.sees(t.queue)) or t.state != "waiting" or t.waits is None:
            return self._miss(t, agent)
        if agent is not None:
            # Who may resolve is part of the wait (issue 28): the model's waits name no resolvers, so only an
            # operator may; an agent (the waiter or another) is refused and nothing changes.
            return FORBIDDEN, t
        self._resolve(t)
        return OK, t

    def resolve_token(self, token: str) -> Outcome:
        """Unknown (or replaced by a later wait of its todo): not found; its wait over already: conflict."""
        t = self.todos.get(self.tokens.get(token, ""))
        if t is None:
            return NOT_FOUND, None
        if t.state != "waiting" or t.waits != "token":
            return CONFLICT, t
        self._resolve(t)
        return OK, t
