"""bench/compare/compare.py's results: rows, the table, the verdicts against the targets, the plot and the
docs section."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness as h
from bench.compare.compare_workers import ALTERNATIVES

if TYPE_CHECKING:
    from bench.compare.compare import Config


@dataclass
class Row:
    what: str
    clients: int | None
    runs: list[float]
    ref: str | None = "claim"  # which ceiling the ratio is to: claim, enqueue, or None
    notes: str = ""
    series: str | None = None  # the plot line this row belongs to
    value: float | None = None
    ratio: float | None = None

    def __post_init__(self) -> None:
        if self.value is None and self.runs:
            self.value = h.median(self.runs)


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        value = f"{row.value:,.0f} jobs/s" if row.value is not None else "-"
        runs = ", ".join(f"{r:,.0f}" for r in row.runs)
        print(f"  {row.what} @ {row.clients}: {value}  [{runs}]  {row.notes}", flush=True)
        return row

    def skip(self, what: str, reason: str) -> None:
        self.skipped.append(f"{what}: {reason}")
        print(f"  SKIPPED {what}: {reason}", flush=True)

    def ceiling(self, ref: str, clients: int | None) -> float | None:
        for row in self.rows:
            if row.series == f"raw-{ref}" and row.clients == clients:
                return row.value
        return None


# ---------------------------------------------------------------------------------------------
# Output


def finish(res: Results) -> None:
    for row in res.rows:
        if row.ref and row.value is not None:
            ceiling = res.ceiling(row.ref, row.clients)
            row.ratio = row.value / ceiling if ceiling else None


def table(res: Results) -> str:
    lines = ["| what | clients | jobs/s | vs raw SQL | notes |", "| --- | ---: | ---: | ---: | --- |"]
    for row in res.rows:
        value = f"{row.value:,.0f}" if row.value is not None else "-"
        ratio = f"{row.ratio:.0%}" if row.ratio is not None else "-"
        lines.append(f"| {row.what} | {row.clients or '-'} | {value} | {ratio} | {row.notes} |")
    return "\n".join(lines)


def verdicts(res: Results, clients: tuple[int, ...]) -> list[str]:
    out = []
    by = {(r.series, r.clients): r for r in res.rows if r.series}
    ahead, ratios, of_psycopg = [], [], []
    for c in clients:
        sb = by.get(("inproc", c))
        if not sb:
            continue
        bare = by.get(("psycopg", c))
        if bare and bare.value:
            of_psycopg.append(f"{c}: {(sb.value or 0) / bare.value:.2f}")
        alts = [by[(s, c)] for s in ALTERNATIVES if (s, c) in by]
        if alts:
            best = max(alts, key=lambda r: r.value or 0)
            ahead.append(
                f"{c} client{'s' if c > 1 else ''}: {(sb.value or 0) / (best.value or 1):.1f}x the best alternative"
            )
        if sb.ratio is not None:
            ratios.append(f"{c}: {sb.ratio:.0%}")
    if ahead:
        out.append("Switchboard in-process against the fastest alternative: " + "; ".join(ahead) + ".")
    if ratios:
        out.append(
            "Switchboard in-process as a share of the raw-SQL ceiling (target >= 70%): " + ", ".join(ratios) + "."
        )
    if of_psycopg:
        # What todos/queue/ and Django add over the same statements from a bare Python client (issue 2's
        # target: >= 0.70).
        out.append("Switchboard in-process / the same SQL on psycopg (target >= 0.70): " + ", ".join(of_psycopg) + ".")
    return out


def plot(res: Results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {
        "raw-claim": "raw SQL (pgbench)",
        "psycopg": "same SQL, psycopg 3 prepared (no Django)",
        "inproc": "Switchboard in-process",
        "inproc-prepared": "Switchboard in-process, prepared statements",
        "http": "Switchboard over HTTP",
        "procrastinate": "Procrastinate 3.10",
        "django_tasks": "django-tasks-db 0.13",
    }
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for series, label in labels.items():
        points = sorted((r.clients, r.value) for r in res.rows if r.series == series and r.value is not None)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r.clients for r in res.rows if r.series and r.clients}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("clients (worker processes x concurrency)")
    ax.set_ylabel("no-op jobs/s (claim + complete)")
    ax.set_title("Throughput against concurrency (median of runs; 2 cores)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def docs_section(res: Results, cfg: Config, machine: str, command: str, seconds: float, rounds: int) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True
    ).stdout.strip()
    parts = [
        "## Against the alternatives",
        "",
        "**Question.** Is Switchboard faster than what a Django user would otherwise pick, and how close does it",
        "come to the raw SQL it runs? One run beside pgbench running the same statements, Procrastinate and",
        "django-tasks-db on the same PostgreSQL.",
        "",
        f"**Command.** `{command}` ({seconds / 60:.1f} minutes; `--quick` checks the harness in about two).",
        "",
        f"**Latest:** {when}, at `{commit or 'unknown'}`, on {machine}.",
        f"Each row is the median of {rounds} run(s), taken in rounds that run every row once (so a busy moment",
        "on the machine lands on one run of each row); the ratio is to the raw-SQL ceiling at the same client count",
        "(pgbench running `todos/sql`'s own CLAIM_NEXT then COMPLETE, two transactions per job, or CREATE for",
        "enqueue rows). Switchboard and pgbench rows run for a fixed time against a seeded backlog; the",
        f"alternatives drain {cfg.jobs} no-op jobs enqueued at once, timed by their own start/finish timestamps.",
        "",
        table(res),
        "",
        *[f"- {v}" for v in verdicts(res, cfg.clients)],
        *[f"- Skipped: {s}" for s in res.skipped],
        "",
        "![throughput against concurrency](img/throughput.png)",
        "",
        "How each ran:",
        "- Switchboard in-process: one forked process per client, each looping `queue.claim_next` then",
        "  `queue.complete` (or `complete_many` for batches) through Django's connection.",
        "- Switchboard over HTTP: the same loop as `POST /api/v1/todos/claim/` then `.../complete/`, against",
        "  gunicorn with the project's `gunicorn.conf.py` (2 workers x 8 threads), clients on the same 2 cores.",
        "- Procrastinate: `procrastinate.contrib.django`, `manage.py procrastinate worker --concurrency C`",
        "  (processes x concurrency 1x1, 1x4, 2x8). django-tasks 0.12 with the django-tasks-db 0.13 backend,",
        "  `manage.py db_worker --interval 0.1` (one process per client). Each in its own settings module under",
        "  `bench/compare/alt_settings/` and its own database.",
        "- Batch rows are Switchboard's alone: neither alternative claims in batches (Procrastinate 3.10",
        "  fetches one job per `procrastinate_fetch_job` call; django-tasks-db locks one task per transaction).",
        "- Latency rows: one client, a handful of pending rows beside N done rows seeded with generate_series",
        "  (then VACUUM ANALYZE, as autovacuum would); p50/p99 of one claim_next + complete.",
        "- The sustained row runs long enough for autovacuum (SPEC trap 3) to work: compare its first and",
        "  last windows; `--soak-seconds` makes it longer.",
        "- Figures are noisy (10-30% between runs is usual on this machine); compare ratios, not absolutes.",
        "",
    ]
    return "\n".join(parts)


def write_docs(section: str, path: Path) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(r"^## Against the alternatives\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)
