"""Operations settings read from the environment: checked in a fresh process, as a deployment starts."""

from __future__ import annotations

import json

from switchboard.tests.conftest import database_url, run_python

SHOW = """
import json
from django.conf import settings
print(json.dumps({
    "aliases": sorted(settings.DATABASES),
    "listener": settings.DATABASES.get("listener", {}).get("HOST"),
    "networks": [str(n) for n in settings.METRICS_ALLOWED_NETWORKS],
    "done_days": settings.RETENTION_DONE_DAYS,
}))
"""


def _settings(**env: str):
    return run_python(
        SHOW, {"DJANGO_SETTINGS_MODULE": "switchboard.settings_test", "DATABASE_URL": database_url(), **env}
    )


def test_listen_database_url_adds_a_direct_alias_for_the_listener(db):
    result = _settings(LISTEN_DATABASE_URL="postgres://sb@db-primary.internal:5432/switchboard")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["aliases"] == ["default", "listener"]
    assert shown["listener"] == "db-primary.internal"


def test_operations_settings_parse_networks_and_windows(db):
    result = _settings(METRICS_ALLOWED_NETWORKS="10.0.0.0/8, 192.168.1.5", RETENTION_DONE_DAYS="2.5")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["networks"] == ["10.0.0.0/8", "192.168.1.5/32"]
    assert shown["done_days"] == 2.5
    assert json.loads(_settings().stdout)["aliases"] == ["default"]


def test_a_bad_metrics_network_stops_the_process_at_start(db):
    result = _settings(METRICS_ALLOWED_NETWORKS="10.0.0.0/33")
    assert result.returncode != 0
    assert "METRICS_ALLOWED_NETWORKS" in result.stderr
