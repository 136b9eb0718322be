"""docs/deploy.md documents every environment variable the settings and gunicorn.conf.py read."""

from __future__ import annotations

import re

from switchboard.tests.conftest import ROOT

READS = re.compile(r"""env\.\w+\(\s*["']([A-Z][A-Z0-9_]+)["']|os\.environ(?:\.get)?[\[(]\s*["']([A-Z][A-Z0-9_]+)["']""")


def _variables(path: str) -> set[str]:
    text = (ROOT / path).read_text()
    return {a or b for a, b in READS.findall(text)}


def test_every_setting_read_from_the_environment_is_in_the_deploy_guide():
    guide = (ROOT / "docs" / "deploy.md").read_text()
    variables = _variables("switchboard/settings.py") | _variables("gunicorn.conf.py")
    assert {"SECRET_KEY", "DATABASE_URL", "GUNICORN_WORKERS", "PURGE_DAILY"} <= variables  # the pattern works
    missing = sorted(v for v in variables if f"`{v}`" not in guide)
    assert not missing, f"docs/deploy.md does not document: {missing}"
