"""The WSGI application boots in a fresh interpreter, as gunicorn's workers do: import order in the
test process can hide circular imports between settings-referenced modules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.db import connection


def test_wsgi_application_imports_in_a_fresh_process(db):
    root = Path(__file__).resolve().parents[2]
    s = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "switchboard.settings_test",
        "DATABASE_URL": f"postgres://{s['USER']}@/{s['NAME']}?host={s['HOST']}",
    }
    code = (
        "from switchboard.wsgi import application; from rest_framework.settings import api_settings; "
        "print(api_settings.DEFAULT_AUTHENTICATION_CLASSES)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "BearerTokenAuthentication" in out.stdout
