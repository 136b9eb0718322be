"""The scale-out proof as a test: bench/ops/scale_out.py (two gunicorn masters, two reapers, one
PostgreSQL, clients on both ports) must end with every todo done exactly once and no 5xx.

It drains SCALE_OUT_TODOS todos (default 1,000, under a minute on two cores; the full proof is the
script's default of 5,000). It needs the todos HTTP API and `manage.py create_agent`, and skips
with a reason where they are not installed.
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

ROOT = Path(__file__).resolve().parents[1]


def _missing() -> str | None:
    try:
        resolve("/api/v1/todos/claim/")
    except Resolver404:
        return "the todos HTTP API (POST /api/v1/todos/claim/) is not installed"
    if "create_agent" not in get_commands():
        return "manage.py create_agent is not installed"
    return None


@pytest.mark.slow
def test_two_web_processes_and_two_reapers_drain_every_todo_exactly_once():
    missing = _missing()
    if missing:
        pytest.skip(missing)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    result = subprocess.run(
        [
            sys.executable,
            "bench/ops/scale_out.py",
            "--todos",
            os.environ.get("SCALE_OUT_TODOS", "1000"),
            "--clients",
            "6",
        ],
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
