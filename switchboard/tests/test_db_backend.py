"""The database backend's health check: no round trip while the connection is quiet, and a
connection the server has closed is found unusable."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_quiet_connection_is_usable_without_a_query(django_assert_num_queries):
    connection.ensure_connection()
    with django_assert_num_queries(0):
        assert connection.is_usable()


def test_a_connection_the_server_terminated_is_unusable():
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    s = connection.settings_dict
    with psycopg.connect(dbname=s["NAME"], user=s["USER"], host=s["HOST"], autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 5
    while connection.is_usable():
        assert time.monotonic() < deadline, "the terminated connection still looks usable"
        time.sleep(0.05)
    connection.close()


def test_the_claim_statements_parse_once_per_process_not_once_per_claim() -> None:
    # psycopg keeps a statement's converted text only up to MAX_CACHED_STATEMENT_LENGTH bytes; the
    # backend raises it above the longest statement of todos/sql (switchboard/db/base.py).
    from psycopg import _queries

    from todos import sql
    from todos.rows import server_cursor

    connection.ensure_connection()  # loads the backend (switchboard/db/base.py)
    longest = max(len(v.encode()) for v in vars(sql).values() if isinstance(v, str))
    assert longest <= _queries.MAX_CACHED_STATEMENT_LENGTH
    _queries._query2pg.cache_clear()
    with server_cursor() as cursor:  # the queue's statements bind on the server (todos/rows.py)
        for _ in range(3):
            cursor.execute("SELECT %(a)s::text || repeat(' ', 0) /*" + "x" * 8000 + "*/", {"a": "x"})
    info = _queries._query2pg.cache_info()
    assert (info.misses, info.hits) == (1, 2)
