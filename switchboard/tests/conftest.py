from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from switchboard import metrics

ROOT = Path(__file__).resolve().parents[2]


def database_url(name: str | None = None) -> str:
    """A DATABASE_URL for the test server (a Unix socket), for settings loaded in a subprocess."""
    s = connection.settings_dict
    return f"postgres://{s['USER']}@/{name or s['NAME']}?host={s['HOST']}"


def run_python(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(autouse=True)
def _fresh_queue_gauges() -> None:
    # The gauges are cached per process for a few seconds; each test reads the database anew.
    metrics.clear_scrape_caches()
