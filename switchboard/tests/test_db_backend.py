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
