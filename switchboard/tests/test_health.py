"""/healthz and /readyz: liveness (the request path moves; the database is reported, not required),
readiness with the database (and its migrations)."""

from __future__ import annotations

import json

import psycopg
import pytest
from django.db import connection

from switchboard.tests.conftest import database_url, run_python

# Requests both probes in a fresh process whose settings point at the given DATABASE_URL.
PROBE = """
import json, django
django.setup()
from django.test import Client
client = Client()
out = {}
for path in ("/healthz", "/readyz", "/metrics"):
    r = client.get(path)
    out[path] = [r.status_code, r.json() if path != "/metrics" else r.content.decode()]
print(json.dumps(out))
"""


def _probe(url: str) -> dict:
    result = run_python(
        PROBE,
        {"DJANGO_SETTINGS_MODULE": "switchboard.settings_test", "DATABASE_URL": url, "DATABASE_CONNECT_TIMEOUT": "2"},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_healthz_makes_one_database_round_trip_bounded_by_a_statement_timeout(client, db, django_assert_num_queries):
    with django_assert_num_queries(4) as captured:  # inside the test's transaction: a savepoint and its release
        response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok"}
    statements = [q["sql"] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert statements == ["SET LOCAL statement_timeout = 2000", "SELECT 1"]


def test_readyz_is_ok_with_the_database_up_and_migrated(client, db):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_checks_migrations_until_they_are_applied_then_only_the_database(client, db, django_assert_num_queries):
    assert client.get("/readyz").status_code == 200
    with django_assert_num_queries(1):  # SELECT 1; the migration answer is remembered
        assert client.get("/readyz").status_code == 200


def test_health_endpoints_need_no_token_and_are_exempt_from_the_https_redirect(client, db, settings):
    settings.SECURE_SSL_REDIRECT = True
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/metrics").status_code == 200
    assert client.get("/admin/").status_code == 301  # everything else is redirected to https


def test_readyz_is_503_and_healthz_200_when_the_database_is_unreachable():
    # Nothing listens on port 1: the connection is refused, as when the server is down.
    out = _probe("postgres://postgres@127.0.0.1:1/switchboard")
    # Restarting the process would not bring the database back: liveness holds, and says why.
    assert out["/healthz"] == [200, {"status": "ok", "database": "unreachable"}]
    status, body = out["/readyz"]
    assert status == 503
    assert body["error"]["code"] == "unavailable"
    assert body["error"]["reason"] == "database_unreachable"
    # /metrics still answers: counters, and the database reported down instead of the queue gauges.
    status, text = out["/metrics"]
    assert status == 200
    assert "switchboard_database_up 0.0" in text
    assert "switchboard_http_requests_total" in text
    assert "switchboard_todos{" not in text


@pytest.fixture
def empty_database(db):
    name = "test_switchboard_ops_unmigrated"
    s = connection.settings_dict
    with psycopg.connect(host=s["HOST"], user=s["USER"], dbname="postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(host=s["HOST"], user=s["USER"], dbname="postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_readyz_is_503_with_the_pending_migrations_on_an_unmigrated_database(empty_database):
    out = _probe(database_url(empty_database))
    assert out["/healthz"][0] == 200
    status, body = out["/readyz"]
    assert status == 503
    assert body["error"]["reason"] == "migrations_pending"
    assert "todos.0003_maintenance_table" in body["error"]["pending"]
