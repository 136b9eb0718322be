"""todos/states.py: each condition's three forms (SQL, Q, predicate) agree on a table holding every
shape a todo can take, and the database's CHECK constraints agree with TodoState and refuse the shapes
the transitions never produce."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models.functions import Now
from django.utils import timezone

from todos import states
from todos.models import Todo, TodoState

HOUR = timedelta(hours=1)

# Every shape the transitions of todos/sql/ leave behind (the reaper keeps a lapsed receipt on the
# pending or dead-lettered todo it sweeps; fail, complete and the reaper keep the owner).
SHAPES = {
    "fresh": {"state": "pending"},
    "requeued after a lapse": {
        "state": "pending",
        "attempt": 1,
        "owner": "a",
        "lease_id": "ls_1",
        "lease_expires_at": -HOUR,
        "claimed_at": -HOUR,
    },
    "claimed": {
        "state": "claimed",
        "attempt": 1,
        "owner": "a",
        "lease_id": "ls_2",
        "lease_expires_at": HOUR,
        "claimed_at": 0,
    },
    "lapsed below the cap": {
        "state": "claimed",
        "attempt": 1,
        "owner": "a",
        "lease_id": "ls_3",
        "lease_expires_at": -HOUR,
        "claimed_at": -HOUR,
    },
    "lapsed at the cap": {
        "state": "claimed",
        "attempt": 5,
        "owner": "a",
        "lease_id": "ls_4",
        "lease_expires_at": -HOUR,
        "claimed_at": -HOUR,
    },
    "retry-waiting": {"state": "failed", "attempt": 1, "owner": "a", "next_retry_at": HOUR, "claimed_at": -HOUR},
    "retry due": {"state": "failed", "attempt": 1, "owner": "a", "next_retry_at": -HOUR, "claimed_at": -HOUR},
    "dead after fail": {"state": "failed", "attempt": 5, "owner": "a", "claimed_at": -HOUR},
    "dead after a lapse at the cap": {
        "state": "failed",
        "attempt": 5,
        "owner": "a",
        "lease_id": "ls_5",
        "lease_expires_at": -HOUR,
        "claimed_at": -HOUR,
    },
    "done": {"state": "done", "attempt": 1, "owner": "a", "claimed_at": -HOUR, "completed_at": 0},
    "discarded": {"state": "done", "completed_at": 0},
    "cancelled while pending": {"state": "cancelled", "completed_at": 0},
    "cancelled while claimed": {
        "state": "cancelled",
        "attempt": 1,
        "owner": "a",
        "claimed_at": -HOUR,
        "completed_at": 0,
    },
    "scheduled for later": {"state": "scheduled", "run_at": HOUR},
    "scheduled and due": {"state": "scheduled", "run_at": -HOUR},
    "waiting after a claim": {
        "state": "waiting",
        "owner": "a",
        "claimed_at": -HOUR,
        "waiting_for": {"token": True},
    },
    "waiting on dependencies": {"state": "waiting", "waiting_for": {"todos": ["td_1"]}},
}
TIMES = ("lease_expires_at", "next_retry_at", "claimed_at", "completed_at", "run_at")

# Which shapes each condition holds for: written out, so that a condition changed by mistake fails here
# even if its three forms still agree with one another.
EXPECTED = {
    "pending": {"fresh", "requeued after a lapse"},
    "claimed": {"claimed", "lapsed below the cap", "lapsed at the cap"},
    "done": {"done", "discarded"},
    "failed": {"retry-waiting", "retry due", "dead after fail", "dead after a lapse at the cap"},
    "cancelled": {"cancelled while pending", "cancelled while claimed"},
    "waiting": {"waiting after a claim", "waiting on dependencies"},
    "lease lapsed": {"lapsed below the cap", "lapsed at the cap"},
    "live lease": {"claimed"},
    "reclaimable": {"lapsed below the cap"},
    "retry-waiting": {"retry-waiting", "retry due"},
    "retry due": {"retry due"},
    "dead-letter": {"dead after fail", "dead after a lapse at the cap"},
    "scheduled": {"scheduled for later", "scheduled and due"},
    "scheduled due": {"scheduled and due"},
    "claimable": {"fresh", "requeued after a lapse", "lapsed below the cap", "retry due", "scheduled and due"},
    "runnable": {
        "fresh",
        "requeued after a lapse",
        "claimed",
        "lapsed below the cap",
        "lapsed at the cap",
        "retry-waiting",
        "retry due",
        "scheduled for later",
        "scheduled and due",
        "waiting after a claim",
        "waiting on dependencies",
    },
    "cancellable": {
        "fresh",
        "requeued after a lapse",
        "claimed",
        "lapsed below the cap",
        "lapsed at the cap",
        "retry-waiting",
        "retry due",
        "scheduled for later",
        "scheduled and due",
        "waiting after a claim",
        "waiting on dependencies",
    },
    "priority changeable": {"fresh", "requeued after a lapse", "scheduled for later", "scheduled and due"},
    "finished": {
        "done",
        "discarded",
        "dead after fail",
        "dead after a lapse at the cap",
        "cancelled while pending",
        "cancelled while claimed",
    },
}


def _insert(name: str, shape: dict) -> Todo:
    values = {k: (Now() + v if isinstance(v, timedelta) else Now()) if k in TIMES else v for k, v in shape.items()}
    todo = Todo.objects.create(queue="shapes", title=name, max_attempts=5, **values)
    todo.refresh_from_db()
    return todo


@pytest.fixture
def table(db) -> dict[str, Todo]:
    return {name: _insert(name, shape) for name, shape in SHAPES.items()}


def test_every_condition_is_named_and_expected():
    assert [c.label for c in states.ALL] == list(EXPECTED)


@pytest.mark.parametrize("condition", states.ALL, ids=lambda c: c.label)
def test_sql_q_and_predicate_agree_on_every_shape(table, condition):
    by_id = {todo.id: name for name, todo in table.items()}
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM todos_todo WHERE {condition.sql()}")
        by_sql = {by_id[row[0]] for row in cursor.fetchall()}
        cursor.execute(f"SELECT t.id FROM todos_todo t WHERE {condition.sql('t')}")
        by_aliased_sql = {by_id[row[0]] for row in cursor.fetchall()}
    by_q = {by_id[pk] for pk in Todo.objects.filter(condition.q).values_list("pk", flat=True)}
    now = timezone.now()
    by_predicate = {name for name, todo in table.items() if condition.holds(todo, now)}
    assert by_sql == by_aliased_sql == by_q == by_predicate == EXPECTED[condition.label]


def test_each_todo_shows_exactly_one_displayed_state(table):
    for name, todo in table.items():
        held = [c.label for c in states.DISPLAYED if c.holds(todo)]
        assert held == [states.label(todo)], name


def _check_definitions() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'todos_todo'::regclass AND contype = 'c'"
        )
        return dict(cursor.fetchall())


def test_the_state_check_constraint_lists_exactly_the_todo_states(db):
    # procrastinate's enum-sync test: the values the database accepts, read back from pg_constraint.
    definition = _check_definitions()["todo_state_valid"]
    assert set(re.findall(r"'([a-z_]+)'", definition)) == set(TodoState.values)


def test_every_state_has_a_shape_constraint(db):
    names = set(_check_definitions())
    assert {f"todo_{state}_shape" for state in TodoState.values} <= names
    assert set(states.SHAPES) == set(TodoState.values)


@pytest.mark.parametrize(
    "bad",
    [
        {"state": "sleeping"},
        {"state": "claimed"},  # no lease
        {"state": "claimed", "owner": "a", "lease_id": "ls_x", "claimed_at": 0},  # no lease expiry
        {"state": "done"},  # no completed_at
        {
            "state": "done",
            "completed_at": 0,
            "lease_id": "ls_x",
            "lease_expires_at": HOUR,
            "owner": "a",
        },  # a live lease
        {"state": "pending", "next_retry_at": HOUR},  # a retry scheduled on pending
        {
            "state": "failed",
            "next_retry_at": HOUR,
            "owner": "a",
            "lease_id": "ls_x",
            "lease_expires_at": HOUR,
        },  # retry + lease
        {"state": "failed", "completed_at": 0},
        {"state": "pending", "lease_id": "ls_x"},  # a receipt with no expiry and no owner
        {"state": "cancelled"},  # no completed_at
        {"state": "cancelled", "completed_at": 0, "owner": "a", "lease_id": "ls_x", "lease_expires_at": HOUR},
        {"state": "cancelled", "completed_at": 0, "next_retry_at": HOUR},
        {
            "state": "scheduled",
            "run_at": HOUR,
            "owner": "a",
            "lease_id": "ls_x",
            "lease_expires_at": HOUR,
        },  # a lease on a scheduled todo
        {"state": "scheduled", "run_at": HOUR, "owner": "a"},  # scheduled todos were never claimed
        {"state": "scheduled", "run_at": HOUR, "next_retry_at": HOUR},  # a retry on a scheduled todo
        {"state": "scheduled", "run_at": HOUR, "completed_at": 0},
        {"state": "waiting"},  # waiting for nothing
        {
            "state": "waiting",
            "waiting_for": {"token": True},
            "owner": "a",
            "lease_id": "ls_x",
            "lease_expires_at": HOUR,
        },  # a lease on a waiting todo
        {"state": "waiting", "waiting_for": {"token": True}, "next_retry_at": HOUR},
        {"state": "waiting", "waiting_for": {"token": True}, "completed_at": 0},
    ],
    ids=repr,
)
def test_the_database_refuses_a_shape_no_transition_produces(db, bad):
    with pytest.raises(IntegrityError), transaction.atomic():
        _insert("bad", bad)


def test_the_live_lease_count_of_max_claimed_is_states_live_lease(table):
    # todos_live_leases() (migration 0014, served by index todo_live_leases) writes the condition out in
    # SQL, as a migration must: it is tied to states.LIVE_LEASE here, in its text and on every shape.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_functiondef('todos_live_leases(text)'::regprocedure)")
        definition = " ".join(cursor.fetchone()[0].split())
        cursor.execute("SELECT todos_live_leases('shapes')")
        counted = cursor.fetchone()[0]
    assert f"WHERE t.queue = queue_name AND {states.LIVE_LEASE.sql('t')})" in definition, definition
    assert counted == len(EXPECTED[states.LIVE_LEASE.label]) == 1
