"""Every admin URL to a todo or an event is built with django.contrib.admin.utils.quote.

Their ids are td_<hex> and ev_<hex>, and the admin unquotes its URLs: "_22", "_23", "_24", "_25", "_26" and
"_40" read as '"', '#', '$', '%', '&' and '@'. So a raw id reaches the admin's "doesn't exist" redirect
for about 1 id in 43 (6 in 256): a link that works in tests 42 runs in 43. That flaked the admin tests
of two full runs in issue 32 (a 302 read as an empty page). Read from the source (product, tests and
bench/), so a new raw URL fails every run, not 1 in 43.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ["switchboard", "todos", "events", "ingest", "bench", "tests"]
STRING_IDS = {
    f"admin:{model}_{view}" for model in ("todos_todo", "events_event") for view in ("change", "delete", "history")
}
RAW_PATHS = ("/admin/todos/todo/", "/admin/events/event/")
ON_PURPOSE = "# raw on purpose"


def _sources() -> list[Path]:
    # bench/out holds extracted old trees (git-ignored), node_modules and .venv others' code: not ours.
    return [
        p
        for folder in FOLDERS
        for p in sorted((ROOT / folder).rglob("*.py"))
        if not {"migrations", "out", "node_modules", ".venv"} & set(p.relative_to(ROOT).parts)
    ]


def _is_quote(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "quote"


def _raw_urls(path: Path, root: Path = ROOT) -> list[str]:
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        line = getattr(node, "lineno", 0)
        if line and ON_PURPOSE in lines[line - 1]:
            continue
        where = f"{path.relative_to(root)}:{line}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "reverse":
            name = node.args[0] if node.args else None
            if not (isinstance(name, ast.Constant) and name.value in STRING_IDS):
                continue
            for keyword in node.keywords:
                if keyword.arg == "args" and isinstance(keyword.value, ast.List | ast.Tuple):
                    found += [where for arg in keyword.value.elts if not _is_quote(arg)]
        elif isinstance(node, ast.JoinedStr):
            parts = node.values
            for before, after in itertools.pairwise(parts):
                if (
                    isinstance(before, ast.Constant)
                    and str(before.value).endswith(RAW_PATHS)
                    and isinstance(after, ast.FormattedValue)
                    and not _is_quote(after.value)
                ):
                    found.append(where)
    return found


def test_admin_urls_to_todos_and_events_quote_their_ids() -> None:
    raw = [where for path in _sources() for where in _raw_urls(path)]
    assert raw == [], f"build these with reverse(..., args=[quote(id)]): {raw}"


def test_the_check_finds_a_raw_url(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        'reverse("admin:todos_todo_change", args=[todo.id])\n'
        'reverse("admin:events_event_change", args=[quote(event.id)])\n'
        'f"/admin/todos/todo/{todo_id}/change/"\n'
        'f"/admin/todos/todo/{quote(todo_id)}/change/"\n'
        'f"/admin/todos/todo/{todo_id}/change/"  # raw on purpose\n'
    )
    assert _raw_urls(probe, tmp_path) == ["probe.py:1", "probe.py:3"]
