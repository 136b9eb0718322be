"""A hypothesis state machine drives the real queue (todos/queue/ on PostgreSQL) and the pure model in
queue_model.py side by side, and after every step compares each todo's state, attempt, dead-letter
flag, receipt and error count, and each call's outcome class (ok / not found / conflict).

Todos come with priorities and some are scheduled (issue 12), and q.b is a fair queue whose todos carry fair_keys
(issue 22): claims must follow the model's claim order,
scheduled ones stay invisible until made due, and run now / set priority move them as the model says.
Holders wait (issue 20) for a token or for other todos; tokens, agents and operators resolve waits,
finishing todos resolve their waiters, and timeouts fire in the reaper.

Runs are derandomized for CI; HYPOTHESIS_QUEUE_EXAMPLES=500 (or more) searches harder locally.
"""

from __future__ import annotations

import copy
import os
from datetime import timedelta
from fnmatch import fnmatchcase
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings
from hypothesis import HealthCheck, event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from todos import queue
from todos.errors import NotAResolver, QueuesForbidden, TodoConflict, TodoNotFound, WaitpointUsed
from todos.models import Agent, Todo, Waitpoint
from todos.tests.queue_model import CONFLICT, FORBIDDEN, NOT_FOUND, OK, ModelAgent, QueueModel
from todos.tests.test_concurrency import run_together

QUEUES = ["q.a", "q.b"]
KEYS = [None, "k1", "k2"]
FAIR_QUEUE = "q.b"  # fair share (issue 22): claims take its todos' fair_keys in turn
FAIR_KEYS = ["", "x", "y"]
# name -> scopes (claim and create alike): alice sees everything, bob only q.a.
AGENTS = {"alice": ["*"], "bob": ["q.a"]}
MISSING = "td_00000000000000000000000000000000"


def outcome_of(call: Any) -> tuple[str, Any]:
    try:
        return OK, call()
    except TodoNotFound:
        return NOT_FOUND, None
    except (TodoConflict, WaitpointUsed):
        return CONFLICT, None
    except NotAResolver:
        return FORBIDDEN, None


class QueueMachine(RuleBasedStateMachine):
    todos = Bundle("todos")
    receipts = Bundle("receipts")  # (todo id, agent name, lease_id), current or stale

    def __init__(self) -> None:
        super().__init__()
        # Each example starts from empty tables (the test is transaction=True: rows really commit).
        with connection.cursor() as cursor:
            cursor.execute(
                "TRUNCATE todos_todo, todos_queue, todos_agent, todos_waitpoint, todos_fairkey, todos_dependency"
                " CASCADE"
            )
            cursor.execute("INSERT INTO todos_queue (name, fair) VALUES (%s, true)", [FAIR_QUEUE])
        self.model = QueueModel(fair={FAIR_QUEUE})
        self.spent: list[tuple[str, str, str]] = []
        self.agents: dict[str, Agent] = {}
        self.model_agents: dict[str, ModelAgent] = {}
        for name, scopes in AGENTS.items():
            agent = Agent(name=name, claim_scopes=scopes, create_scopes=scopes)
            agent.set_new_token()
            agent.save()
            self.agents[name] = agent
            self.model_agents[name] = ModelAgent(name, scopes)

    def check(self, what: str, real: str, expected: str) -> None:
        event(f"{what.split()[0]}: {real}")  # --hypothesis-show-statistics shows what a run covered
        assert real == expected, f"{what}: the queue said {real}, the model {expected}"

    # --- producers -------------------------------------------------------------------------------
    @rule(
        target=todos,
        queue_name=st.sampled_from(QUEUES),
        key=st.sampled_from(KEYS),
        assignee=st.sampled_from([None, None, None, "bob"]),
        max_attempts=st.sampled_from([1, 2, 2, 3]),
        priority=st.sampled_from([0, 0, -1, 1]),
        scheduled=st.sampled_from([False, False, True]),
        fair_key=st.sampled_from(FAIR_KEYS),
    )
    def create(
        self,
        queue_name: str,
        key: str | None,
        assignee: str | None,
        max_attempts: int,
        priority: int,
        scheduled: bool,
        fair_key: str,
    ) -> str:
        todo, created = queue.create(
            queue=queue_name,
            idempotency_key=key,
            assignee=assignee,
            max_attempts=max_attempts,
            title="m",
            priority=priority,
            delay_seconds=3600 if scheduled else None,
            fair_key=fair_key,
        )
        expected, expected_created = self.model.create(
            todo.id, queue_name, key, assignee, max_attempts, priority, scheduled, fair_key
        )
        self.check("created", str(created), str(expected_created))
        assert todo.id == expected.id, "create returned another todo than the key's runnable holder"
        return todo.id

    @rule(
        target=todos,
        queue_name=st.sampled_from(QUEUES),
        key=st.sampled_from(KEYS),
        depends_on=st.lists(todos, min_size=1, max_size=3),
        policy=st.sampled_from(["cancel", "run"]),
    )
    def create_depending(self, queue_name: str, key: str | None, depends_on: list[str], policy: str) -> str:
        todo, created = queue.create(
            queue=queue_name,
            idempotency_key=key,
            max_attempts=2,
            title="m",
            depends_on=depends_on,
            on_dependency_failure=policy,
        )
        expected, expected_created = self.model.create_depending(todo.id, queue_name, key, depends_on, policy)
        self.check("created depending", str(created), str(expected_created))
        assert todo.id == expected.id, "create returned another todo than the key's runnable holder"
        return todo.id

    @rule(
        target=receipts,
        agent=st.sampled_from(list(AGENTS)),
        wanted=st.sampled_from([None, ["q.a"], ["q.b"], ["q.*"]]),
        limit=st.integers(1, 3),
    )
    def claim_next(self, agent: str, wanted: list[str] | None, limit: int) -> Any:
        scopes = AGENTS[agent]
        outside = [w for w in wanted or [] if not any(fnmatchcase(w, s) or fnmatchcase(s, w) for s in scopes)]
        if outside:  # naming a queue the agent may never claim from is refused, and takes nothing
            with pytest.raises(QueuesForbidden):
                queue.claim_next(agent=self.agents[agent], queues=wanted, limit=limit)
            return multiple()
        expected = self.model.choose_next(
            self.model_agents[agent], None if wanted in (None, ["q.*"]) else wanted, limit
        )
        got = queue.claim_next(agent=self.agents[agent], queues=wanted, limit=limit)
        assert [t.id for t in got] == [t.id for t in expected], "claim_next took other todos than the model"
        for real, model in zip(got, expected, strict=True):
            self.model.take(model, self.model_agents[agent], real.lease_id)
        return multiple(*[(t.id, agent, t.lease_id) for t in got])

    @rule(target=receipts, limits=st.tuples(st.integers(1, 3), st.integers(1, 3)))
    def two_claim_the_fair_queue_at_once(self, limits: tuple[int, int]) -> Any:
        """Two claimers on their own connections at the same instant (issue 31): fair claims take turns on the
        queue's row, so the outcome is the model's two claims one after the other, in one order or the other."""
        agent, model_agent = self.agents["alice"], self.model_agents["alice"]
        got = run_together([lambda n=n: queue.claim_next(agent=agent, queues=[FAIR_QUEUE], limit=n) for n in limits])
        for order in ((0, 1), (1, 0)):
            model = copy.deepcopy(self.model)
            for i in order:
                expected = model.choose_next(model_agent, [FAIR_QUEUE], limits[i])
                if [t.id for t in expected] != [t.id for t in got[i]]:
                    break
                for real, m in zip(got[i], expected, strict=True):
                    model.take(m, model_agent, real.lease_id)
            else:
                self.model = model
                return multiple(*[(t.id, "alice", t.lease_id) for todos in got for t in todos])
        raise AssertionError(f"two claims at once took {got}, which no order of the model's claims takes")

    @rule(target=receipts, todo_id=todos, agent=st.sampled_from(list(AGENTS)))
    def claim(self, todo_id: str, agent: str) -> Any:
        expected, model = self.model.claim(todo_id, self.model_agents[agent])
        real, todo = outcome_of(lambda: queue.claim(todo_id, agent=self.agents[agent]))
        self.check(f"claim {todo_id} by {agent}", real, expected)
        if real != OK:
            return multiple()
        self.model.take(model, self.model_agents[agent], todo.lease_id)
        return (todo_id, agent, todo.lease_id)

    @rule(agent=st.sampled_from(list(AGENTS)), verb=st.sampled_from(["claim", "complete", "retry"]))
    def act_on_a_missing_todo(self, agent: str, verb: str) -> None:
        calls = {
            "claim": lambda: queue.claim(MISSING, agent=self.agents[agent]),
            "complete": lambda: queue.complete(MISSING, agent=self.agents[agent], lease_id="ls_x"),
            "retry": lambda: queue.retry_dead_letter(MISSING, mode="reset", operator="ops"),
        }
        real, _ = outcome_of(calls[verb])
        self.check(f"{verb} missing", real, NOT_FOUND)

    # --- the receipt holder's verbs ------------------------------------------------------------------
    def _with_receipt(self, verb: str, receipt: tuple[str, str, str], who: str, **kwargs: Any) -> None:
        todo_id, holder, lease_id = receipt
        agent = holder if who == "holder" else who
        expected, _ = self.model.with_receipt(verb, todo_id, self.model_agents[agent], lease_id)
        real, _ = outcome_of(
            lambda: getattr(queue, verb)(todo_id, agent=self.agents[agent], lease_id=lease_id, **kwargs)
        )
        self.check(f"{verb} {todo_id} by {agent}", real, expected)

    @rule(receipt=receipts, who=st.sampled_from(["holder", "holder", "alice", "bob"]))
    def heartbeat(self, receipt: tuple[str, str, str], who: str) -> None:
        self._with_receipt("heartbeat", receipt, who, lease_seconds=3600)

    # complete, fail and release spend their receipt: later steps mostly use live ones. A spent one may
    # still come back through replay_a_spent_receipt.
    @rule(receipt=consumes(receipts), who=st.sampled_from(["holder", "holder", "holder", "alice", "bob"]))
    def complete(self, receipt: tuple[str, str, str], who: str) -> None:
        self._with_receipt("complete", receipt, who, result={"by": who})
        self.spent.append(receipt)

    @rule(
        receipt=consumes(receipts),
        who=st.sampled_from(["holder", "holder", "holder", "bob"]),
        retry_in=st.sampled_from([None, 3600]),
    )
    def fail(self, receipt: tuple[str, str, str], who: str, retry_in: int | None) -> None:
        self._with_receipt("fail", receipt, who, error="boom", retry_in_seconds=retry_in)
        self.spent.append(receipt)

    @rule(receipt=consumes(receipts), who=st.sampled_from(["holder", "holder", "holder", "bob"]))
    def release(self, receipt: tuple[str, str, str], who: str) -> None:
        self._with_receipt("release", receipt, who)
        self.spent.append(receipt)

    @rule(
        receipt=consumes(receipts),
        data=st.data(),
        kind=st.sampled_from(["token", "todos", "todos"]),
        on_timeout=st.sampled_from(["pending", "fail"]),
        who=st.sampled_from(["holder", "holder", "holder", "bob"]),
    )
    def wait(self, receipt: tuple[str, str, str], data: st.DataObject, kind: str, on_timeout: str, who: str) -> None:
        todo_id, holder, lease_id = receipt
        self._wait(todo_id, holder if who == "holder" else who, lease_id, data, kind, on_timeout)
        self.spent.append(receipt)

    # The interesting case, often: the holder of a live lease waits (the receipts bundle rarely has one).
    @precondition(lambda self: any(t.state == "claimed" for t in self.model.todos.values()))
    @rule(
        data=st.data(),
        kind=st.sampled_from(["token", "todos", "todos"]),
        on_timeout=st.sampled_from(["pending", "fail"]),
    )
    def wait_on_a_claimed_todo(self, data: st.DataObject, kind: str, on_timeout: str) -> None:
        held = [t for t in sorted(self.model.todos.values(), key=lambda t: t.seq) if t.state == "claimed"]
        t = data.draw(st.sampled_from(held), label="waiting")
        self._wait(t.id, t.owner or "alice", t.lease or "", data, kind, on_timeout)

    def _wait(self, todo_id: str, agent: str, lease_id: str, data: st.DataObject, kind: str, on_timeout: str) -> None:
        awaited: list[str] = []
        if kind == "todos":
            others = [t.id for t in sorted(self.model.todos.values(), key=lambda t: t.seq) if t.id != todo_id]
            if not others:
                return
            awaited = data.draw(st.lists(st.sampled_from(others), min_size=1, max_size=3, unique=True), label="for")
        expected, _ = self.model.wait(todo_id, self.model_agents[agent], lease_id, kind, awaited, None, on_timeout)
        real, answer = outcome_of(
            lambda: queue.wait(
                todo_id,
                agent=self.agents[agent],
                lease_id=lease_id,
                wait_for={"token": True} if kind == "token" else {"todos": awaited},
                timeout_seconds=3600,
                on_timeout=on_timeout,
            )
        )
        self.check(f"wait {todo_id} by {agent} for {kind}", real, expected)
        if real == OK and answer[1] is not None:
            self.model.tokens[answer[1]] = todo_id

    @rule(todo_id=todos, as_bob=st.booleans())
    def resolve(self, todo_id: str, as_bob: bool) -> None:
        self._resolve(todo_id, as_bob)

    @precondition(lambda self: any(t.state == "waiting" for t in self.model.todos.values()))
    @rule(data=st.data(), as_bob=st.booleans())
    def resolve_a_waiting_todo(self, data: st.DataObject, as_bob: bool) -> None:
        waiting = [t.id for t in sorted(self.model.todos.values(), key=lambda t: t.seq) if t.state == "waiting"]
        self._resolve(data.draw(st.sampled_from(waiting), label="resolving"), as_bob)

    def _resolve(self, todo_id: str, as_bob: bool) -> None:
        agent = self.agents["bob"] if as_bob else None
        expected, _ = self.model.resolve(todo_id, self.model_agents["bob"] if as_bob else None)
        real, _ = outcome_of(lambda: queue.resolve(todo_id, by="bob" if as_bob else "ops", agent=agent, data={}))
        self.check(f"resolve {todo_id}", real, expected)

    @precondition(lambda self: self.model.tokens)
    @rule(data=st.data())
    def resolve_token(self, data: st.DataObject) -> None:
        token = data.draw(st.sampled_from([*sorted(self.model.tokens), "wpt_unknown"]), label="token")
        expected, _ = self.model.resolve_token(token)
        real, _ = outcome_of(lambda: queue.resolve_token(token, data={"ok": True}))
        self.check("resolve_token", real, expected)

    # Fan-in, often: a todo some waiter still waits for is cancelled (or completed, if it is leased).
    @precondition(lambda self: any(t.state == "waiting" and t.left for t in self.model.todos.values()))
    @rule(data=st.data())
    def finish_an_awaited_todo(self, data: st.DataObject) -> None:
        awaited = sorted({i for t in self.model.todos.values() if t.state == "waiting" for i in t.left})
        todo_id = data.draw(st.sampled_from(awaited), label="finishing")
        t = self.model.todos[todo_id]
        if t.state == "claimed" and t.lease and t.owner:
            self._with_receipt("complete", (todo_id, t.owner, t.lease), "holder", result={"n": 1})
        else:
            self._cancel(todo_id, False)

    @precondition(
        lambda self: any(t.state == "waiting" and t.waits and not t.timeout_due for t in self.model.todos.values())
    )
    @rule(data=st.data())
    def make_a_wait_time_out(self, data: st.DataObject) -> None:
        waiting = [
            t.id
            for t in sorted(self.model.todos.values(), key=lambda t: t.seq)
            if t.state == "waiting" and t.waits and not t.timeout_due  # a dependency waiter has no timeout
        ]
        todo_id = data.draw(st.sampled_from(waiting), label="timing out")
        Waitpoint.objects.filter(todo_id=todo_id).update(timeout_at=Now() - timedelta(seconds=1))
        self.model.todos[todo_id].timeout_due = True

    @precondition(lambda self: self.spent)
    @rule(data=st.data(), verb=st.sampled_from(["heartbeat", "complete", "fail", "release"]))
    def replay_a_spent_receipt(self, data: st.DataObject, verb: str) -> None:
        receipt = data.draw(st.sampled_from(self.spent), label="spent receipt")
        self._with_receipt(verb, receipt, "holder")

    # --- the operator and the sidecar ------------------------------------------------------------------
    @rule(todo_id=todos, mode=st.sampled_from(["reset", "once"]), as_bob=st.booleans())
    def retry_dead_letter(self, todo_id: str, mode: str, as_bob: bool) -> None:
        self._retry(todo_id, mode, as_bob)

    @precondition(lambda self: any(t.dead for t in self.model.todos.values()))
    @rule(data=st.data(), mode=st.sampled_from(["reset", "once"]), as_bob=st.booleans())
    def retry_a_dead_letter(self, data: st.DataObject, mode: str, as_bob: bool) -> None:
        dead = [t.id for t in self.model.todos.values() if t.dead]
        self._retry(data.draw(st.sampled_from(dead), label="dead letter"), mode, as_bob)

    def _retry(self, todo_id: str, mode: str, as_bob: bool) -> None:
        agent = self.agents["bob"] if as_bob else None
        expected, _ = self.model.retry_dead_letter(todo_id, mode, self.model_agents["bob"] if as_bob else None)
        real, _ = outcome_of(lambda: queue.retry_dead_letter(todo_id, mode=mode, operator="ops", agent=agent))
        self.check(f"retry_dead_letter {todo_id} ({mode})", real, expected)

    @rule(todo_id=todos, as_bob=st.booleans())
    def cancel(self, todo_id: str, as_bob: bool) -> None:
        self._cancel(todo_id, as_bob)

    @precondition(lambda self: any(t.state == "claimed" for t in self.model.todos.values()))
    @rule(data=st.data(), as_bob=st.booleans())
    def cancel_a_claimed_todo(self, data: st.DataObject, as_bob: bool) -> None:
        # The interesting case: a worker holds the lease; its receipt must stop working.
        held = [t.id for t in self.model.todos.values() if t.state == "claimed"]
        self._cancel(data.draw(st.sampled_from(held), label="cancelling"), as_bob)

    def _cancel(self, todo_id: str, as_bob: bool) -> None:
        agent = self.agents["bob"] if as_bob else None
        expected, _ = self.model.cancel(todo_id, self.model_agents["bob"] if as_bob else None)
        real, _ = outcome_of(lambda: queue.cancel(todo_id, operator="ops", agent=agent))
        self.check(f"cancel {todo_id}", real, expected)

    @rule(todo_id=todos)
    def run_now(self, todo_id: str) -> None:
        expected, _ = self.model.run_now(todo_id)
        real, _ = outcome_of(lambda: queue.run_now(todo_id, operator="ops"))
        self.check(f"run_now {todo_id}", real, expected)

    @rule(todo_id=todos, priority=st.sampled_from([-2, 0, 2]))
    def set_priority(self, todo_id: str, priority: int) -> None:
        expected, _ = self.model.set_priority(todo_id, priority)
        real, _ = outcome_of(lambda: queue.set_priority(todo_id, priority=priority))
        self.check(f"set_priority {todo_id}", real, expected)

    @precondition(
        lambda self: any(
            (t.state == "claimed" and t.lapsed)
            or t.retry == "due"
            or (t.state == "scheduled" and t.due_now)
            or (t.state == "waiting" and t.timeout_due)
            for t in self.model.todos.values()
        )
    )
    @rule()
    def reap_once(self) -> None:
        result = queue.reap_once(batch=2)
        expected = self.model.reap()
        assert (
            result.requeued,
            result.dead_lettered,
            result.retries_promoted,
            result.scheduled_promoted,
            result.waits_timed_out,
        ) == expected
        event(f"reap_once: {'swept' if result.total else 'idle'}")

    # --- time passing, one todo at a time --------------------------------------------------------------
    @precondition(lambda self: any(t.state == "claimed" and not t.lapsed for t in self.model.todos.values()))
    @rule(data=st.data())
    def lapse_a_lease(self, data: st.DataObject) -> None:
        # Ordered by creation, not by id: ids are random, and a replayed example must pick the same todo.
        held = [t.id for t in self.model.todos.values() if t.state == "claimed" and not t.lapsed]
        todo_id = data.draw(st.sampled_from(held), label="lapsing")
        Todo.objects.filter(pk=todo_id).update(lease_expires_at=Now() - timedelta(seconds=1))
        self.model.lapse(self.model.todos[todo_id])

    @precondition(lambda self: any(t.retry == "waiting" for t in self.model.todos.values()))
    @rule(data=st.data())
    def make_a_retry_due(self, data: st.DataObject) -> None:
        waiting = [t.id for t in self.model.todos.values() if t.retry == "waiting"]
        todo_id = data.draw(st.sampled_from(waiting), label="due")
        Todo.objects.filter(pk=todo_id).update(next_retry_at=Now() - timedelta(seconds=1))
        self.model.make_due(self.model.todos[todo_id])

    @precondition(lambda self: any(t.state == "scheduled" and not t.due_now for t in self.model.todos.values()))
    @rule(data=st.data())
    def make_a_scheduled_todo_due(self, data: st.DataObject) -> None:
        waiting = [t.id for t in self.model.todos.values() if t.state == "scheduled" and not t.due_now]
        todo_id = data.draw(st.sampled_from(waiting), label="scheduled due")
        # now(): this statement's own time, after every todo created so far and before every later claim.
        Todo.objects.filter(pk=todo_id).update(run_at=Now())
        self.model.make_scheduled_due(self.model.todos[todo_id])

    # --- after every step ------------------------------------------------------------------------
    @invariant()
    def every_todo_matches_the_model(self) -> None:
        rows = {t.id: t for t in Todo.objects.all()}
        assert rows.keys() == self.model.todos.keys()
        for todo_id, m in self.model.todos.items():
            r = rows[todo_id]
            real = (r.state, r.attempt, r.max_attempts, r.is_dead_letter, r.lease_id, len(r.errors), r.priority)
            expected = (m.state, m.attempt, m.max_attempts, m.dead, m.lease, m.errors, m.priority)
            if real != expected:
                note(f"{todo_id}: queue {real}, model {expected}")
            assert real == expected, f"{todo_id} (state, attempt, max, dead, lease, errors, priority) differs"
            if m.state == "claimed":
                assert r.owner == m.owner
            if m.state == "failed" and m.retry == "waiting":
                assert r.next_retry_at is not None


@pytest.mark.django_db(transaction=True)
# Backoff is random up to this ceiling; far enough that no retry falls due by itself during a run.
@override_settings(QUEUE_RETRY_BASE_SECONDS=1e9, QUEUE_RETRY_CAP_SECONDS=1e10, QUEUE_DEFAULT_LEASE_SECONDS=3600)
def test_queue_agrees_with_the_model_step_by_step():
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(
            max_examples=int(os.environ.get("HYPOTHESIS_QUEUE_EXAMPLES", "100")),
            stateful_step_count=50,
            deadline=None,
            derandomize="HYPOTHESIS_QUEUE_EXAMPLES" not in os.environ,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
