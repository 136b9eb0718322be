"""The scale-out proof as a test: bench/ops/scale_out.py (two gunicorn masters, two reapers, one
PostgreSQL, clients on both ports) must end with every todo done exactly once and no 5xx.

It drains SCALE_OUT_TODOS todos (default 1,000, under a minute on two cores; the full proof is the
script's default of 5,000); and, small, issue 32's proof: two machines behind PgBouncer, each holding
long-polls through the drain (the full proof: --longpolls 2000, docs/benchmarks.md). It needs the todos
HTTP API and `manage.py create_agent` (and PgBouncer for the second), and skips with a reason where they
are not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import get_commands
from django.urls import Resolver404, resolve

from todos.tests.pgbouncer_support import PGBOUNCER

ROOT = Path(__file__).resolve().parents[1]


def _missing() -> str | None:
    try:
        resolve("/api/v1/todos/claim/")
    except Resolver404:
        return "the todos HTTP API (POST /api/v1/todos/claim/) is not installed"
    if "create_agent" not in get_commands():
        return "manage.py create_agent is not installed"
    return None


def _run(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    result = subprocess.run(
        [sys.executable, "bench/ops/scale_out.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["failures"] == []
    assert summary["done"] == summary["todos"]
    assert summary["redelivered"] == summary["abandoned"] > 0
    assert not any(key.split()[1].startswith("5") for key in summary["statuses"])
    return summary


@pytest.mark.slow
def test_two_web_processes_and_two_reapers_drain_every_todo_exactly_once():
    missing = _missing()
    if missing:
        pytest.skip(missing)
    _run("--todos", os.environ.get("SCALE_OUT_TODOS", "1000"), "--clients", "6")


@pytest.mark.slow
def test_two_machines_behind_pgbouncer_holding_long_polls_drain_every_todo_exactly_once():
    """Issue 32's proof, small: two machines behind one PgBouncer in transaction mode, each holding idle
    long-polls through the drain; the web processes' statements use at most the pool's server connections."""
    missing = _missing() or (
        None if Path(PGBOUNCER).exists() else "pgbouncer is not installed (apt-get install pgbouncer)"
    )
    if missing:
        pytest.skip(missing)
    pool = 6
    summary = _run(
        "--todos",
        "300",
        "--clients",
        "4",
        "--web-machines",
        "2",
        "--pgbouncer",
        "--pool-size",
        str(pool),
        "--longpolls",
        "100",
    )
    assert summary["longpolls_held"] == 200
    assert 0 < summary["pgbouncer"]["servers"] <= pool and summary["pgbouncer"]["clients"] > 0
    assert 0 < summary["pg_connections_web_max"] <= pool, summary["pg_connections_by_app"]
    assert summary["claim_p99_ms"] > 0
