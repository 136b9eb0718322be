"""The benchmark and drill harness's pure parts (the runs themselves are on demand: make bench,
bench-compare, drills). These keep bench/ off real data and in step with todos/sql/ and the docs."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from bench import harness
from bench.compare.compare_report import Results, Row, finish, table, verdicts, write_docs
from bench.compare.compare_workers import pgbench_statements
from bench.drills import handlers
from todos.models import Agent, Todo


@pytest.mark.parametrize("purpose", ["", "explain", "admin", "ops", "scale_out", "drill_crash", "procrastinate"])
def test_every_bench_database_name_passes_the_scratch_check(purpose: str) -> None:
    name = harness.scratch_db(purpose)
    assert harness.require_scratch(name) == name


@pytest.mark.parametrize("name", ["switchboard", "postgres", "production", "todos"])
def test_a_database_not_named_as_a_scratch_one_is_refused(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "MAIN_DATABASE", "some_other_database")
    with pytest.raises(SystemExit, match=f"refusing database '{name}'.*'bench' or 'scratch'"):
        harness.require_scratch(name)


def test_the_configured_database_is_refused_even_when_its_name_says_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "MAIN_DATABASE", "switchboard_bench")
    with pytest.raises(SystemExit, match="the project's configured database"):
        harness.require_scratch("switchboard_bench")


def test_the_configured_database_is_database_urls_else_the_embedded_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://app@db.internal:5432/switchboard_prod")
    assert harness._configured_database() == "switchboard_prod"
    monkeypatch.delenv("DATABASE_URL")
    monkeypatch.delenv("EMBEDDED_PG_DATABASE", raising=False)
    assert harness._configured_database() == "switchboard"


def test_the_django_bootstrap_refuses_a_non_scratch_database_before_changing_anything() -> None:
    before = dict(os.environ)
    with pytest.raises(SystemExit, match="refusing database 'switchboard'"):
        harness.setup_django("postgresql://postgres@/switchboard?host=/tmp")
    assert dict(os.environ) == before


def test_the_server_refuses_to_create_or_drop_a_non_scratch_database() -> None:
    # No server listens at this address: a refusal must come before any connection is tried.
    server = harness.PgServer(url="postgresql://postgres@127.0.0.1:1/postgres")
    with pytest.raises(SystemExit, match="refusing"):
        server.create_database("switchboard")
    with pytest.raises(SystemExit, match="refusing"):
        server.drop_database("switchboard")


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


@pytest.mark.django_db(transaction=True)
def test_seeded_todos_of_each_state_are_what_the_queues_transitions_act_on(
    make_agent: Callable[..., Agent],
) -> None:
    from todos import queue

    harness.seed_todos(3, queue="bench.pending", title="'pending ' || g")
    harness.seed_todos(2, queue="bench.seeded", state="done", first=4)
    harness.seed_todos(2, queue="bench.seeded", state="lapsed", first=6)
    harness.seed_todos(2, queue="bench.seeded", state="retry_due", first=8)
    harness.seed_todos(1, queue="bench.seeded", state="retry_waiting", first=10)
    harness.seed_todos(4, queue="bench.seeded", state="dead", first=11, where="g %% 2 = 0")
    harness.seed_todos(1, queue="bench.held", state="claimed", first=15)
    worker = make_agent("bench", claim=["bench.*"])  # seeded claims are held by "bench"

    claimed = queue.claim_next(agent=worker, queues=["bench.pending"], limit=10)
    assert [t.title for t in claimed] == ["pending 1", "pending 2", "pending 3"]
    assert queue.requeue_lapsed(batch=10).requeued == 2
    assert queue.promote_due_retries(batch=10) == 2
    dead = Todo.objects.filter(state="failed", next_retry_at__isnull=True).values_list("id", flat=True)
    assert len(dead) == 2  # g = 12 and 14 of 11..14
    assert queue.retry_dead_letter(dead[0], mode="once", operator="bench").state == "pending"
    held = Todo.objects.get(queue="bench.held")
    assert held.lease_id
    assert queue.complete(held.id, agent=worker, lease_id=held.lease_id).state == "done"
    assert Todo.objects.filter(state="done").count() == 3


def test_the_queue_mode_reports_queue_py_against_the_same_sql_on_psycopg() -> None:
    res = Results()
    res.rows += [
        Row("raw", 2, [2000.0], series="raw-claim"),
        Row("psycopg", 2, [1000.0], series="psycopg"),
        Row("sb", 2, [850.0], series="inproc"),
    ]
    finish(res)
    assert "Switchboard in-process / the same SQL on psycopg (target >= 0.70): 2: 0.85." in verdicts(res, (2,))
