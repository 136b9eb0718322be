"""The database plumbing under todos/queue/: a server-binding cursor on Django's connection, and
Todos built from rows of sql.TODO_COLUMNS without the ORM's per-query cost."""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

from switchboard import dberrors
from switchboard.dberrors import retrying_once
from todos import sql
from todos.errors import TodoConflict
from todos.models import RUNNABLE_KEY_CONSTRAINT, Todo


def server_cursor(db: BaseDatabaseWrapper | None = None) -> CursorWrapper:
    """A cursor on Django's connection (same transaction, error wrapping and query logging as
    ``connection.cursor()``) that binds parameters on the server.

    Django's own cursors bind on the client, so psycopg can never prepare their statements. These few
    statements run thousands of times a second, and planning the claim scan costs more than running it:
    bound on the server they are prepared once per connection (OPTIONS prepare_threshold in settings;
    psycopg never prepares client-bound statements, so the ORM is unaffected).
    """
    db = db or connections[DEFAULT_DB_ALIAS]
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    raw = psycopg.Cursor(db.connection)
    # The stubs say these wrap a CursorWrapper; Django passes them the driver's cursor, as here.
    return db.make_debug_cursor(raw) if db.queries_logged else db.make_cursor(raw)  # type: ignore[arg-type]


def _field_positions() -> tuple[list[int], list[tuple[int, Any]]]:
    """Where each of the model's concrete fields sits among sql.TODO_COLUMNS, and which need decoding."""
    columns = [c.strip() for c in sql.TODO_COLUMNS.split(",")]
    fields = Todo._meta.concrete_fields
    order = [columns.index(str(f.column)) for f in fields]
    decode = [(i, f) for i, f in enumerate(fields) if hasattr(f, "from_db_value")]  # the JSON fields
    return order, decode


_ORDER, _DECODE = _field_positions()
_ATTNAMES = [f.attname for f in Todo._meta.concrete_fields]


def todo_from_row(row: tuple[Any, ...], db: BaseDatabaseWrapper) -> Todo:
    """The Todo that Todo.objects.raw() would build from a row of sql.TODO_COLUMNS, for a fraction of its
    cost: no per-query column introspection, and (while nothing listens to Todo's init signals) no
    Model.__init__, which only sets the same attributes one by one. `make bench` measures it."""
    values = [row[i] for i in _ORDER]
    for i, field in _DECODE:
        values[i] = field.from_db_value(values[i], None, db)
    if pre_init.has_listeners(Todo) or post_init.has_listeners(Todo):
        return Todo.from_db(db.alias, _ATTNAMES, values)
    todo = Todo.__new__(Todo)
    todo.__dict__.update(zip(_ATTNAMES, values, strict=True))
    todo._state = ModelState()
    todo._state.adding = False
    todo._state.db = db.alias
    return todo


def fetch_todos(statement: str, params: dict[str, Any]) -> list[Todo]:
    """Run a statement that returns sql.TODO_COLUMNS; build its rows into Todos. Each statement is one
    guarded transition, so one that a deadlock aborted is run again once (switchboard/dberrors.py)."""
    db = connections[DEFAULT_DB_ALIAS]  # one lookup of the thread's connection, not one per use

    def run() -> list[Todo]:
        with server_cursor(db) as cursor:
            cursor.execute(statement, params)
            return [todo_from_row(row, db) for row in cursor.fetchall()]

    return retrying_once(run)


def fetch_todos_reviving(statement: str, params: dict[str, Any], action: str, todo_id: str) -> list[Todo]:
    """Run a statement that can make a finished todo runnable again, which fails if a newer runnable
    todo holds its idempotency key. Inside a caller's transaction a savepoint keeps that failure
    from aborting the caller's work."""
    try:
        if connection.in_atomic_block:
            with transaction.atomic():
                return fetch_todos(statement, params)
        return fetch_todos(statement, params)
    except IntegrityError as exc:
        if dberrors.constraint_name(exc) != RUNNABLE_KEY_CONSTRAINT:
            raise  # a violated shape CHECK is a bug in the statement, not the caller's conflict
        raise TodoConflict(
            f"Cannot {action} {todo_id}: a newer runnable todo holds its idempotency key.",
            state="failed",
            reason="idempotency_key_taken",
        ) from exc


def fetchall(statement: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run a statement on a server-binding cursor and return its rows as they are (the sweeps); run
    again once if a deadlock aborted it, as fetch_todos."""

    def run() -> list[tuple[Any, ...]]:
        with server_cursor() as cursor:
            cursor.execute(statement, params)
            rows: list[tuple[Any, ...]] = cursor.fetchall()
            return rows

    return retrying_once(run)
