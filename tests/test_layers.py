"""The layers point one way (docs/architecture.md): switchboard/ <- todos/ <- events/ <- ingest/.

Read from the source, not from sys.modules, so an import inside a function counts as much as one at
the top of a module. Tests and migrations are left out: tests drive every layer, and migrations name
the callables of the models they were made from.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["switchboard", "todos", "events", "ingest"]  # each may import only those before it

# Imports another change of this wave removes (bearer auth leaves switchboard/api.py). Each entry goes
# when its module stops importing the app.
PENDING: set[tuple[str, str]] = set()
APPS = ["todos", "events", "ingest"]


def product_modules(package: str) -> list[Path]:
    return [
        p
        for p in sorted((ROOT / package).rglob("*.py"))
        if "tests" not in p.relative_to(ROOT).parts and "migrations" not in p.relative_to(ROOT).parts
    ]


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", LAYERS)
def test_a_layer_imports_no_layer_above_it(package):
    above = LAYERS[LAYERS.index(package) + 1 :]
    wrong = sorted(
        (str(path.relative_to(ROOT)), name)
        for path in product_modules(package)
        for name in imported_modules(path)
        if name.split(".")[0] in above and (str(path.relative_to(ROOT)), name.split(".")[0]) not in PENDING
    )
    assert wrong == []


def _is_admin(module: str) -> bool:
    parts = module.split(".")
    return len(parts) > 1 and parts[1].startswith("admin")


def test_no_app_imports_another_apps_admin():
    # An app's admin is its top: other apps reach its pages by URL name, and its badges through the
    # admin site's registry (events/admin.py), never by import.
    wrong = sorted(
        (str(path.relative_to(ROOT)), name)
        for package in APPS
        for path in product_modules(package)
        for name in imported_modules(path)
        if name.split(".")[0] in APPS and name.split(".")[0] != package and _is_admin(name)
    )
    assert wrong == []


def test_the_pending_exceptions_are_still_needed():
    # When another helper's change lands, its entry must go, or the rule would silently loosen.
    for module, app in PENDING:
        assert any(name.split(".")[0] == app for name in imported_modules(ROOT / module)), (module, app)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(path: Path, known: set[str]) -> set[str]:
    """The product modules ``path`` imports when it is imported (its module-level statements): what can
    close a cycle at import time. ``from a import b`` names the module a.b when there is one, else a."""
    found: set[str] = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                inner = f"{node.module}.{alias.name}"
                found.add(inner if inner in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & known


def test_no_module_imports_itself_back_at_import_time():
    # Issue 34: the queue package and its neighbours have no import cycles (each points one way).
    paths = {_module_name(p): p for package in LAYERS for p in product_modules(package)}
    known = set(paths)
    graph = {name: _top_level_imports(path, known) - {name} for name, path in paths.items()}
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            cycles.append([*trail[trail.index(name) :], name])
            return
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert cycles == []
