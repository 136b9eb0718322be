"""docs/security.md stays true where a test can tell: every test its attack table names exists in the file
named beside it, and every attack test file of the suite is named there (issue 28)."""

from __future__ import annotations

import re

from switchboard.tests.conftest import ROOT

DOC = (ROOT / "docs" / "security.md").read_text()
ATTACK_FILES = sorted(p.relative_to(ROOT) for p in ROOT.glob("*/tests/test_security_*.py"))


def _defined(path: str) -> set[str]:
    files = [p for p in ATTACK_FILES if str(p).endswith(path)]
    assert len(files) == 1, f"docs/security.md names {path}: found {files}"
    return set(re.findall(r"^(?:async )?def (test_\w+)", (ROOT / files[0]).read_text(), re.M))


def test_every_test_the_attack_table_names_exists():
    named = re.findall(r"`((?:[a-z_]+/)*test_security_[a-z_]+\.py)::(test_\w+)", DOC)
    assert len(named) > 40  # the pattern finds them
    missing = sorted(f"{path}::{name}" for path, name in named if name not in _defined(path))
    assert missing == []


def test_every_attack_test_file_is_in_the_table():
    assert ATTACK_FILES
    assert sorted(str(p) for p in ATTACK_FILES if p.name not in DOC) == []
