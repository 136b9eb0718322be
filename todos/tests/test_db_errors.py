"""Database errors told apart by their SQLSTATE (switchboard/dberrors.py), with real errors from the real
server: an outage answers 503 ``unavailable``, a timeout 503 ``timeout``, a deadlock is run again once, and
an error no retry can cure is neither retried nor passed off as an outage. Logs name the SQLSTATE and the
server's message."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction
from django.test import RequestFactory

from switchboard import dberrors
from switchboard.api import DatabaseUnavailableMiddleware
from switchboard.dberrors import Failure
from todos import queue
from todos.listener import Listener, listener
from todos.models import Todo, TodoState


def _params(**overrides: Any) -> dict[str, Any]:
    return {**listener._connection_params(), "application_name": "test-dberrors", **overrides}


@pytest.fixture
def other() -> Iterator[psycopg.Connection[Any]]:
    """A second session, committing on its own."""
    with psycopg.connect(**_params(), autocommit=True) as conn:
        yield conn


def _django_error(statement: str) -> DatabaseError:
    """The error Django raises for ``statement``, run in a savepoint of the test's transaction."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement)
    except DatabaseError as exc:
        return exc
    raise AssertionError(f"{statement!r} did not fail")


@pytest.mark.django_db
def test_a_value_the_server_refuses_is_broken_and_described_by_sqlstate_and_message():
    exc = _django_error("SELECT 1 LIMIT -1")
    assert dberrors.classify(exc) is Failure.BROKEN
    assert dberrors.describe(exc) == "InvalidRowCountInLimitClause SQLSTATE 2201W: LIMIT must not be negative"


@pytest.mark.django_db
def test_statement_and_lock_timeouts_are_timeouts():
    assert dberrors.classify(_django_error("SET LOCAL statement_timeout = 1; SELECT pg_sleep(1)")) is Failure.TIMEOUT
    assert dberrors.sqlstate(_django_error("SET LOCAL statement_timeout = 1; SELECT pg_sleep(1)")) == "57014"


def test_a_server_that_cannot_be_reached_is_unavailable(tmp_path):
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(**_params(host=str(tmp_path), port=5999, connect_timeout=2))
    assert dberrors.classify(caught.value) is Failure.UNAVAILABLE
    assert "No such file or directory" in dberrors.describe(caught.value)


@pytest.mark.django_db
def test_a_terminated_session_is_unavailable(other):
    with psycopg.connect(**_params(), autocommit=True) as doomed:
        other.execute("SELECT pg_terminate_backend(%s)", [doomed.info.backend_pid])
        with pytest.raises(psycopg.OperationalError) as caught:
            doomed.execute("SELECT 1")
    assert dberrors.classify(caught.value) is Failure.UNAVAILABLE


def _deadlock(first: str, second: str) -> psycopg.Error:
    """Two sessions that lock rows of a scratch table in opposite orders; the error of the one that loses."""
    errors: list[psycopg.Error] = []
    with psycopg.connect(**_params(), autocommit=True) as setup:
        setup.execute("CREATE TABLE IF NOT EXISTS dberrors_scratch (id int PRIMARY KEY)")
        setup.execute("INSERT INTO dberrors_scratch VALUES (1), (2) ON CONFLICT DO NOTHING")
    both_locked = threading.Barrier(2)

    def lock(a: str, b: str) -> None:
        with psycopg.connect(**_params()) as conn:
            try:
                conn.execute(f"SELECT 1 FROM dberrors_scratch WHERE id = {a} FOR UPDATE")
                both_locked.wait(10)
                conn.execute(f"SELECT 1 FROM dberrors_scratch WHERE id = {b} FOR UPDATE")
            except psycopg.Error as exc:
                errors.append(exc)

    threads = [threading.Thread(target=lock, args=pair) for pair in ((first, second), (second, first))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    [error] = errors
    return error


def test_a_deadlock_is_contention_and_answers_503_with_its_sqlstate_in_the_log(caplog):
    error = _deadlock("1", "2")
    assert dberrors.classify(error) is Failure.CONTENTION
    with caplog.at_level(logging.WARNING, logger="switchboard.db"):
        code, _ = dberrors.error_answer(error) or ("", "")
    assert code == "unavailable"
    assert "SQLSTATE 40P01: deadlock detected" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_statement_a_deadlock_aborted_is_run_again_once(make_todo, other, caplog):
    first, second = make_todo("q"), make_todo("q")
    other.execute("BEGIN")
    other.execute("SELECT 1 FROM todos_todo WHERE id = %s FOR UPDATE", [second.id])
    out: dict[str, Any] = {}

    def cancel() -> None:
        try:
            with connection.cursor() as cursor:  # a scan in insertion order: first is locked, then second
                cursor.execute("SET enable_indexscan = off; SET enable_bitmapscan = off")
            out["cancelled"] = queue.cancel_many([first.id, second.id], operator="op")
        except Exception as exc:
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=cancel)
    with caplog.at_level(logging.WARNING, logger="switchboard.db"):
        thread.start()
        _wait_until_blocked()
        # The other session now waits for first: a deadlock, and the cancel (which waited first) loses.
        other.execute("UPDATE todos_todo SET title = 'touched' WHERE id = %s", [first.id])
        other.execute("COMMIT")
        thread.join(30)
    assert "error" not in out, out
    assert {t.id for t in out["cancelled"]} == {first.id, second.id}
    assert "contention, retrying once" in caplog.text and "40P01" in caplog.text
    assert set(Todo.objects.values_list("state", flat=True)) == {TodoState.CANCELLED}


def _wait_until_blocked() -> None:
    """Until some session waits for a row lock."""
    deadline = time.monotonic() + 10
    with psycopg.connect(**_params(), autocommit=True) as watcher:
        while time.monotonic() < deadline:
            if watcher.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone():
                return
            time.sleep(0.02)
    raise AssertionError("no session is waiting for a lock")


@pytest.mark.django_db(transaction=True)
def test_the_api_answers_a_lock_timeout_with_503_timeout(api, other):
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '200ms'")
    other.execute("BEGIN")
    other.execute("LOCK TABLE todos_todo IN ACCESS EXCLUSIVE MODE")
    try:
        response = api.get("/todos/")
    finally:
        other.execute("ROLLBACK")
        connection.close()  # and its lock_timeout with it
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "timeout"
    assert response["Retry-After"] == "1"


@pytest.mark.django_db
def test_an_error_whose_text_says_connection_is_not_an_outage(caplog):
    # Once read as "database unavailable" because its text holds the word "connection".
    exc = _django_error("SELECT 'connection'::integer")
    middleware = DatabaseUnavailableMiddleware(lambda request: None)
    request = RequestFactory().get("/api/v1/todos/")
    with caplog.at_level(logging.ERROR):
        response = middleware.process_exception(request, exc)
    assert response is not None and response.status_code == 500


@pytest.mark.django_db
def test_the_middleware_answers_a_lock_timeout_with_503_timeout(other):
    other.execute("BEGIN")
    other.execute("LOCK TABLE todos_todo IN ACCESS EXCLUSIVE MODE")
    try:
        exc = _django_error("SET LOCAL lock_timeout = '100ms'; SELECT count(*) FROM todos_todo")
    finally:
        other.execute("ROLLBACK")
    response = DatabaseUnavailableMiddleware(lambda request: None).process_exception(
        RequestFactory().get("/admin/todos/todo/"), exc
    )
    assert response is not None and response.status_code == 503
    assert b'"timeout"' in response.content


class _MisconfiguredListener(Listener):
    def __init__(self, **overrides: Any) -> None:
        super().__init__()
        self.overrides = overrides

    def _connection_params(self) -> dict[str, Any]:
        return {**super()._connection_params(), **self.overrides}


def _listener_log(overrides: dict[str, Any], caplog: pytest.LogCaptureFixture, wait: Callable[[], bool]) -> None:
    failing = _MisconfiguredListener(**overrides)
    with caplog.at_level(logging.WARNING, logger="todos.listener"):
        failing._ensure_running()
        try:
            deadline = time.monotonic() + 10
            while not wait() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            failing.stop()


@pytest.mark.django_db
def test_the_listener_logs_why_it_cannot_connect(caplog):
    def said() -> bool:
        return 'role "no_such_role_here" does not exist' in caplog.text

    _listener_log({"user": "no_such_role_here"}, caplog, said)
    assert said(), caplog.text
    assert "listener connection failed" in caplog.text
