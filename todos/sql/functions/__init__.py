"""The current text of every SQL function and trigger of the todos schema, one ``.sql`` file each.

A migration that changes one edits its file and loads it by name (``load("todos_settle_dependents")``), so
its text lives in one place instead of in whichever migration last changed it; migrations before 0022 keep
the text of their time. todos/tests/test_sql_functions.py checks that the database holds exactly these
texts, and that no function or trigger of ours lives outside a file.
"""

from __future__ import annotations

from pathlib import Path

from django.db import migrations

FOLDER = Path(__file__).resolve().parent


def names() -> list[str]:
    return sorted(path.stem for path in FOLDER.glob("*.sql"))


def text(name: str) -> str:
    return (FOLDER / f"{name}.sql").read_text()


def load(*wanted: str) -> migrations.RunSQL:
    """A migration step that (re)creates these functions, with their triggers, from their files. The file may
    be newer than the migration: function bodies are checked when they run, not when a fresh database's older
    migration creates them, so only a signature change needs its own DROP first."""
    body = "\n".join(text(name) for name in wanted)
    return migrations.RunSQL(f"SET LOCAL check_function_bodies = off;\n{body}", migrations.RunSQL.noop)
