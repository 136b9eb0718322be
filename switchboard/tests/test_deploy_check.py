"""`manage.py check --deploy` passes with the production environment docs/deploy.md describes."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

from switchboard.tests.conftest import ROOT, database_url

# Variables the test process itself sets (settings_test) or a developer's shell might: none of them
# may leak into the production-like environment.
_NOT_INHERITED = ("DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL", "DJANGO_SETTINGS_MODULE")


def production_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED and not k.startswith("SECURE_")}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "switchboard.settings",
            "SECRET_KEY": secrets.token_urlsafe(50),
            "ALLOWED_HOSTS": "switchboard.example.com",
            "CSRF_TRUSTED_ORIGINS": "https://switchboard.example.com",
            "TRUST_X_FORWARDED_PROTO": "true",
            "DATABASE_URL": database_url(),
            **extra,
        }
    )
    return env


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_deploy_passes_with_the_documented_production_settings(db):
    result = check_deploy(production_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_check_deploy_fails_when_debug_is_on(db):
    result = check_deploy(production_env(DEBUG="true"))
    assert result.returncode != 0
    assert "security.W018" in result.stdout + result.stderr  # DEBUG in production


def test_settings_refuse_to_start_without_a_secret_key(db):
    env = production_env()
    del env["SECRET_KEY"]
    result = check_deploy(env)
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr
