"""The docs keep one home per fact: docs/deploy.md documents every environment variable the settings and
gunicorn.conf.py read; the README stays the pitch, the two commands, the first ten minutes and links,
with no state table (docs/architecture.md holds the one); and no page links to a file that is gone."""

from __future__ import annotations

import re

from switchboard.tests.conftest import ROOT
from todos.models import TodoState

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


README = (ROOT / "README.md").read_text()
DOC_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
TABLE_ROW = re.compile(r"^\s*\|(.*)\|\s*$", re.M)


def test_the_readme_holds_no_state_table():
    # One state table, in docs/architecture.md: the README once held two that disagreed with it.
    first_cells = {row.split("|")[0].strip().strip("`*").lower() for row in TABLE_ROW.findall(README)}
    assert "state" not in first_cells, "a state table in the README: it belongs in docs/architecture.md"
    assert first_cells.isdisjoint(TodoState.values), "rows of a state table in the README"


def test_the_readme_is_the_pitch_the_commands_the_first_ten_minutes_and_links():
    assert len(README.splitlines()) < 250
    assert [line for line in README.splitlines() if line.startswith("## ")] == [
        "## The two commands",
        "## The first ten minutes",
        "## Read on",
    ]


def test_every_file_the_readme_and_docs_link_to_exists():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
    assert len(pages) > 8
    broken = [
        f"{page.relative_to(ROOT)} -> {target}"
        for page in pages
        for target in DOC_LINK.findall(page.read_text())
        if not target.startswith(("http://", "https://")) and not (page.parent / target).exists()
    ]
    assert broken == []


def _benchmark_headings() -> list[tuple[int, str, str]]:
    """(level, title, body) of each ## and ### heading of docs/benchmarks.md before its appendix."""
    text = (ROOT / "docs" / "benchmarks.md").read_text().split("\n## Appendix", 1)[0]
    headings = []
    for part in re.split(r"\n(?=###? )", text)[1:]:
        title, _, body = part.partition("\n")
        headings.append((title.count("#", 0, 3), title.lstrip("# "), body))
    return headings


def _benchmark_sections() -> dict[str, str]:
    # A section is a ### heading, or a ## heading with none under it; the other ## are bench/'s groups.
    headings = _benchmark_headings()
    return {
        title: body
        for i, (level, title, body) in enumerate(headings)
        if title != "Summary" and (level == 3 or i + 1 == len(headings) or headings[i + 1][0] == 2)
    }


def test_each_benchmark_states_its_question_its_command_and_a_dated_latest_table_with_its_commit():
    # docs/benchmarks.md is reference, not a diary: older runs live in its appendix.
    sections = _benchmark_sections()
    assert len(sections) >= 12
    for title, body in sections.items():
        assert "**Question.**" in body and "**Command.**" in body, title
        latest = body.split("**Latest:**", 1)[-1][:400]
        assert "**Latest:**" in body and re.search(r"20\d\d-\d\d-\d\d", latest), title
        assert re.search(r"`[0-9a-f]{7,}`", latest), f"{title}: the latest table names no commit"


def test_benchmarks_follow_bench_groups_and_every_anchor_names_a_heading():
    groups = [t for level, t, body in _benchmark_headings() if level == 2 and "**Question.**" not in body]
    named = [re.search(r"\(bench/(\w+)/\)", t) for t in groups if t != "Summary"]
    assert all(named), groups
    folders = {p.parent.name for p in (ROOT / "bench").glob("*/__init__.py")} - {"drills", "compare"}
    assert sorted(m.group(1) for m in named if m) == sorted(folders)
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    slugs = {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in text.splitlines()
        if line.startswith("#")
    }
    assert sorted(set(re.findall(r"\]\(#([^)]+)\)", text)) - slugs) == []


def test_bench_readme_lists_every_script_with_its_question_under_its_group():
    # bench/ is grouped by question: harness.py is shared, every other script lives in a group's folder,
    # and bench/README.md has one section a group ("## claim/: ...") listing each of its scripts.
    bench = ROOT / "bench"
    assert sorted(p.name for p in bench.glob("*.py")) == ["__init__.py", "harness.py"]
    readme = (bench / "README.md").read_text()
    sections = {part.split("/", 1)[0]: part for part in re.split(r"\n## ", readme)[1:]}
    groups = sorted(p.parent.name for p in bench.glob("*/__init__.py"))
    assert groups == sorted(sections)
    unlisted = [
        f"{group}/{script.name}"
        for group in groups
        if group != "drills"
        for script in (bench / group).glob("*.py")
        if script.name != "__init__.py" and f"`{script.name}`" not in sections[group]
    ]
    assert unlisted == []
    assert sum(1 for group in groups for p in (bench / group).glob("*.py") if p.name != "__init__.py") > 15
    assert "`python -m bench.drills`" in sections["drills"]
