"""The benchmark and drill harness's pure parts (the runs themselves are on demand: make
bench-compare, make drills). These keep bench/ in step with todos/sql.py and the docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import harness
from bench.compare_report import Results, Row, finish, table, write_docs
from bench.compare_workers import pgbench_statements
from bench.drills import handlers


def test_pgbench_statements_fill_every_placeholder_of_todos_sql() -> None:
    claim_complete, create = pgbench_statements(["bench%"], ["bench%"])
    for script in (claim_complete, create):
        assert "%(" not in script
    # claim, \gset, then the complete that uses the claimed row's id and receipt
    claim, complete = claim_complete.split("\n\\gset\n")
    assert "FOR UPDATE SKIP LOCKED" in claim and claim.lstrip().startswith("WITH queues AS")
    assert re.search(r"WHERE id = :id AND lease_id = :lease_id", complete)
    assert "ON CONFLICT (queue, idempotency_key)" in create


def test_ratio_is_to_the_ceiling_at_the_same_client_count() -> None:
    res = Results()
    res.rows += [
        Row("raw", 4, [1000.0, 900.0, 1100.0], series="raw-claim"),
        Row("raw", 16, [2000.0], series="raw-claim"),
        Row("sb", 4, [700.0, 800.0, 750.0]),
        Row("wake", 1, [], ref=None, notes="p50 5 ms"),
    ]
    finish(res)
    assert res.rows[2].value == 750.0 and res.rows[2].ratio == pytest.approx(0.75)
    assert res.rows[3].ratio is None
    assert "| sb | 4 | 750 | 75% |  |" in table(res)


def test_write_docs_replaces_only_its_own_section(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Queue\nmine\n\n## Against the alternatives\nold\n\n## Ops\ntheirs\n")
    write_docs("## Against the alternatives\n\nnew\n\n", doc)
    assert doc.read_text() == "# Benchmarks\n\n## Queue\nmine\n\n## Against the alternatives\n\nnew\n\n## Ops\ntheirs\n"


def test_write_docs_appends_its_section_when_absent(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Queue\nmine\n")
    write_docs("## Against the alternatives\n\nnew\n", doc)
    assert doc.read_text().endswith("mine\n\n## Against the alternatives\n\nnew\n")


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert harness.percentile(values, 50) == 50.0
    assert harness.percentile(values, 99) == 99.0
    assert harness.percentile([3.0], 99) == 3.0


def test_record_handler_writes_one_line_per_processing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record_file = tmp_path / "records.txt"
    monkeypatch.setenv("DRILL_RECORD_FILE", str(record_file))
    monkeypatch.setenv("DRILL_HANDLER_SECONDS", "0")
    handlers.record({"id": "td_a"})
    handlers.record({"id": "td_a"})
    handlers.record({"id": "td_b"})
    assert [line.split()[0] for line in record_file.read_text().splitlines()] == ["td_a", "td_a", "td_b"]


def test_boom_handler_raises_with_the_todo_id() -> None:
    with pytest.raises(RuntimeError, match="td_x"):
        handlers.boom({"id": "td_x"})
