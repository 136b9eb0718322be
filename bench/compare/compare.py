"""Switchboard against the raw-SQL ceiling and the alternatives a Django user would pick, in one run.

    make bench-compare                      # the full run (about 13 minutes on 2 cores)
    make bench                              # --mode queue: queue.py against the same SQL (psycopg, pgbench)
    make bench-http                         # --mode http: over HTTP beside in-process, and long-poll wake
    .venv/bin/python bench/compare/compare.py --quick                       # every row once, short: a check
    .venv/bin/python bench/compare/compare.py --mode http --quick           # one mode, short
    .venv/bin/python bench/compare/compare.py --only raw,inproc --seconds 30   # long runs: see autovacuum work

Everything runs in dedicated databases (switchboard_bench, switchboard_bench_procrastinate,
switchboard_bench_django_tasks) on the embedded PostgreSQL, or on the server of DATABASE_URL (whose
role then needs CREATEDB; CHECKPOINT after seeding is skipped unless it is a superuser).
Each row is the median of --runs runs in jobs/s, with its ratio to the raw-SQL ceiling: pgbench
running todos/sql's own CLAIM_NEXT and COMPLETE (or CREATE) statements on the same table with
the same number of clients. --docs rewrites the "## Against the alternatives" section of
docs/benchmarks.md and docs/img/throughput.png from the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness as h
from bench.compare import compare_history
from bench.compare.compare_alternatives import alt_drain, alt_plan
from bench.compare.compare_report import Results, Row, docs_section, finish, plot, table, verdicts, write_docs
from bench.compare.compare_workers import (
    AGENT,
    ALTERNATIVES,
    INGEST_QUEUE,
    LONGPOLL_QUEUE,
    QUEUE,
    http_worker,
    ingest_worker,
    inproc_worker,
    make_agent,
    pgbench,
    pgbench_scripts,
    psycopg_worker,
    run_processes,
)

SECTIONS = (
    "raw",
    "inproc",
    "psycopg",
    "prepared",
    "enqueue",
    "batch",
    "http",
    "procrastinate",
    "django_tasks",
    "latency",
    "soak",
    "ingest",
)

# Named subsets of SECTIONS (the Makefile's targets), with their client counts; --only and --clients
# override them. The pgbench rows run in every mode: they are the ceiling each ratio is to.
MODES = {
    "queue": (("inproc", "psycopg"), (1, 2, 4, 8)),
    "http": (("inproc", "http", "batch"), (1, 4, 16)),
    "ingest": (("ingest",), (4, 16)),
}


@dataclass
class Config:
    clients: tuple[int, ...] = (1, 4, 16)
    runs: int = 3
    seconds: float = 4.0  # one timed run of a claim+complete row
    enqueue_seconds: float = 3.0
    jobs: int = 3000  # jobs drained per run by an alternative
    batch_clients: tuple[int, ...] = (4,)
    history: tuple[int, ...] = (0, 100_000, 1_000_000)
    samples: int = 1000  # claim+complete cycles timed per history size
    soak_seconds: float = 45.0
    soak_clients: int = 16
    ingest_clients: tuple[int, ...] = (4, 16)
    longpoll_samples: int = 20
    budget_minutes: float = 14.0  # the whole run; rounds stop early rather than pass it
    only: tuple[str, ...] = SECTIONS


# ---------------------------------------------------------------------------------------------
# Sections


@dataclass
class Spec:
    """One row of the throughput matrix. The matrix runs in rounds, every row once per round, so a
    row's median draws on runs spread over the whole benchmark: a busy minute on a shared machine
    lands on one run of every row instead of on all runs of one row."""

    what: str
    clients: int
    measure: Callable[[], float]
    ref: str | None = "claim"
    series: str | None = None
    notes: str = ""
    runs: list[float] = field(default_factory=list)


class Bench:
    def __init__(self, cfg: Config, server: h.PgServer) -> None:
        self.cfg = cfg
        self.server = server
        self.res = Results()
        _, self.sb_url = h.scratch_django("", server=server)
        self.token = make_agent()
        self.claim_script, self.enqueue_script = pgbench_scripts()
        # The most any row has done so far: sizes the backlog seeded for the next run.
        self.best = 0.0
        self.warnings: set[str] = set()
        self.enqueue_rates: dict[str, list[float]] = {name: [] for name in ALTERNATIVES}
        self.started = time.monotonic()
        self.rounds = 0

    def backlog(self, seconds: float) -> int:
        return int(max(self.best, 3000) * seconds * 1.6) + 5000

    def fresh(self, pending: int) -> None:
        h.reset_todos()
        h.seed_todos(pending, queue=QUEUE)
        h.analyze()

    # -- one run of each kind of row ------------------------------------------------------------
    def raw_claim(self, clients: int) -> float:
        self.fresh(max(self.backlog(self.cfg.seconds), int(12000 * self.cfg.seconds)))
        tps, warn = pgbench(self.sb_url, self.claim_script, clients, self.cfg.seconds)
        if warn:
            self.warnings.add(f"pgbench at {clients} clients: {warn}")
        self.best = max(self.best, tps)
        return tps

    def raw_enqueue(self, clients: int) -> float:
        h.reset_todos()
        return pgbench(self.sb_url, self.enqueue_script, clients, self.cfg.enqueue_seconds)[0]

    def inproc(self, clients: int, limit: int = 1, prepared: bool = False) -> float:
        self.fresh(self.backlog(self.cfg.seconds) * (3 if limit > 1 else 1))
        run = run_processes(inproc_worker, clients, self.cfg.seconds, "claim", limit, prepared)
        if run.errors:
            raise RuntimeError(f"{run.errors} in-process worker errors (tracebacks above)")
        self.best = max(self.best, run.rate)
        return run.rate

    def inproc_enqueue(self, clients: int) -> float:
        h.reset_todos()
        return run_processes(inproc_worker, clients, self.cfg.enqueue_seconds, "enqueue", 1).rate

    def psycopg(self, clients: int) -> float:
        from todos.models import Agent

        agent = Agent.objects.get(name=AGENT)
        self.fresh(self.backlog(self.cfg.seconds))
        patterns = (agent.claim_like_patterns(), agent.visible_like_patterns())
        return run_processes(psycopg_worker, clients, self.cfg.seconds, self.sb_url, *patterns).rate

    def http(self, base: str, clients: int, limit: int = 1) -> float:
        self.fresh(int(self.backlog(self.cfg.seconds) * (3 if limit > 1 else 0.5)))
        run = run_processes(http_worker, clients, self.cfg.seconds, base, self.token, limit)
        if run.errors:
            print(f"    {run.errors} HTTP errors in this run", flush=True)
        return run.rate

    def ingest(self, base: str, slug: str, secret: str, clients: int) -> float:
        run = run_processes(ingest_worker, clients, self.cfg.enqueue_seconds, base, slug, secret)
        if run.errors:
            print(f"    {run.errors} ingest errors in this run", flush=True)
        return run.rate

    def alternative(self, name: str, url: str, clients: int) -> float:
        _, settings_module = ALTERNATIVES[name]
        procs, concurrency = alt_plan(name, clients)
        rate, enqueue_rate = alt_drain(name, url, settings_module, procs, concurrency, self.cfg.jobs)
        self.enqueue_rates[name].append(enqueue_rate)
        return rate

    # -- the matrix -------------------------------------------------------------------------------
    def specs(self, base: str | None, batch_api: bool, ingest: tuple[str, str, str] | None) -> list[Spec]:
        """The rows to run: ``base`` is the HTTP API's URL if it is there, ``ingest`` (URL, slug, secret) if
        ingestion is."""
        only, clients = self.cfg.only, self.cfg.clients
        specs = [
            Spec("raw SQL claim, then complete (pgbench)", c, lambda c=c: self.raw_claim(c), series="raw-claim")
            for c in clients
        ]
        if "enqueue" in only:
            specs += [
                Spec(
                    "raw SQL enqueue, CREATE with a key (pgbench)",
                    c,
                    lambda c=c: self.raw_enqueue(c),
                    ref="enqueue",
                    series="raw-enqueue",
                )
                for c in clients
            ]
        if "psycopg" in only:
            specs += [
                Spec(
                    "the same SQL from Python processes, psycopg 3, prepared",
                    c,
                    lambda c=c: self.psycopg(c),
                    series="psycopg",
                )
                for c in clients
            ]
        if "inproc" in only:
            specs += [
                Spec("Switchboard in-process, claim_next + complete", c, lambda c=c: self.inproc(c), series="inproc")
                for c in clients
            ]
        if "prepared" in only:
            specs += [
                Spec(
                    "Switchboard in-process, prepared statements",
                    c,
                    lambda c=c: self.inproc(c, prepared=True),
                    series="inproc-prepared",
                    notes="OPTIONS server_side_binding=True, prepare_threshold=5",
                )
                for c in clients
            ]
        if "inproc" in only and "enqueue" in only:
            specs += [
                Spec("Switchboard in-process, create with a key", c, lambda c=c: self.inproc_enqueue(c), ref="enqueue")
                for c in clients
            ]
        if "batch" in only:
            specs += [
                Spec(
                    f"Switchboard in-process, claim_next(limit={n}) + complete_many",
                    c,
                    lambda c=c, n=n: self.inproc(c, n),
                )
                for n in (10, 100)
                for c in self.cfg.batch_clients
            ]
        if base and "http" in only:
            specs += [
                Spec(
                    "Switchboard over HTTP, claim + complete",
                    c,
                    lambda c=c, base=base: self.http(base, c),
                    series="http",
                )
                for c in clients
            ]
            if batch_api and "batch" in only:
                specs += [
                    Spec(
                        f"Switchboard over HTTP, claim limit={n} + batch complete",
                        c,
                        lambda c=c, n=n, base=base: self.http(base, c, n),
                    )
                    for n in (10, 100)
                    for c in self.cfg.batch_clients
                ]
        if ingest:
            url, slug, secret = ingest
            specs += [
                Spec(
                    "ingest: signed GitHub deliveries -> event + todo",
                    c,
                    lambda c=c, url=url, slug=slug, secret=secret: self.ingest(url, slug, secret, c),
                    ref="enqueue",
                    notes="deliveries/s",
                )
                for c in self.cfg.ingest_clients
            ]
        for name, (label, settings_module) in ALTERNATIVES.items():
            if name not in only:
                continue
            url = self.server.create_database(h.scratch_db(name))
            h.migrate(url, settings_module)
            for c in clients:
                procs, concurrency = alt_plan(name, c)
                shape = f"{procs} process{'es' if procs > 1 else ''}"
                if name == "procrastinate":
                    shape += f" x {concurrency}"
                specs.append(
                    Spec(
                        label,
                        c,
                        lambda c=c, name=name, url=url: self.alternative(name, url, c),
                        series=name,
                        notes=f"{shape}; drains {self.cfg.jobs} jobs",
                    )
                )
        return specs

    def matrix(self) -> None:
        only = set(self.cfg.only)
        with contextlib.ExitStack() as stack:
            http_base: str | None = None
            batch_api = False
            ingest: tuple[str, str, str] | None = None
            if only & {"http", "ingest"}:
                base = stack.enter_context(h.gunicorn(self.sb_url))
                api = h.Api(base, self.token)
                status, body = api.post("/api/v1/todos/claim/", {"queues": [QUEUE]})
                if status == 200 and isinstance(body, dict) and "todos" in body:
                    http_base = base
                    batch_api = api.post("/api/v1/todos/complete/", {"items": []})[0] not in (404, 405)
                    if not batch_api:
                        self.res.skip("HTTP batch claims", "POST /api/v1/todos/complete/ is missing")
                else:
                    self.res.skip("Switchboard over HTTP", f"POST /api/v1/todos/claim/ answered {status}, not the API")
                    self.res.skip("long-poll wake latency", "no claim endpoint")
                source = self.ingest_source() if "ingest" in only else None
                ingest = (base, *source) if source else None
            specs = self.specs(http_base, batch_api, ingest)
            for round_no in range(1, self.cfg.runs + 1):
                round_started = time.monotonic()
                print(f"round {round_no} of {self.cfg.runs} ({len(specs)} rows)", flush=True)
                for spec in specs:
                    rate = spec.measure()
                    spec.runs.append(rate)
                    print(f"  {spec.what} @ {spec.clients}: {rate:,.0f} jobs/s", flush=True)
                self.rounds = round_no
                # The whole run has a time budget (15 minutes on the 2-core machine): on a slow or busy
                # machine, fewer rounds rather than an overrun. What follows the matrix is reserved.
                now = time.monotonic()
                after_matrix = 90 + (self.cfg.soak_seconds if "soak" in only else 0)
                if round_no < self.cfg.runs and (
                    now - self.started + (now - round_started) + after_matrix > self.cfg.budget_minutes * 60
                ):
                    print(f"  stopping after {round_no} round(s): another would pass --budget-minutes", flush=True)
                    self.res.skipped.append(
                        f"rounds {round_no + 1}-{self.cfg.runs}: they would have passed the "
                        f"{self.cfg.budget_minutes:g}-minute budget"
                    )
                    break
            for spec in specs:
                self.res.rows.append(
                    Row(spec.what, spec.clients, spec.runs, ref=spec.ref, series=spec.series, notes=spec.notes)
                )
            for name, rates in self.enqueue_rates.items():
                if rates:
                    label = "Procrastinate defer()" if name == "procrastinate" else "django-tasks enqueue()"
                    self.res.rows.append(
                        Row(
                            f"{label}, one by one in one transaction",
                            1,
                            rates,
                            ref="enqueue",
                            notes="median over every drain run's enqueue",
                        )
                    )
            if http_base and "http" in only:
                self.longpoll(http_base, h.Api(http_base, self.token))
        for warning in sorted(self.warnings):
            print(f"  warning: {warning}")

    def ingest_source(self) -> tuple[str, str] | None:
        from django.apps import apps
        from django.urls import Resolver404, resolve

        try:
            resolve("/ingest/bench/")
            source_model = apps.get_model("ingest", "Source")
            route_model = apps.get_model("ingest", "Route")
        except (Resolver404, LookupError):
            self.res.skip("ingest deliveries/s", "no /ingest/<slug>/ view or ingest.Source/Route models yet")
            return None
        secret = "bench-secret-" + uuid.uuid4().hex
        slug = "bench-github"
        source_model.objects.filter(slug=slug).delete()
        source = source_model.objects.create(**_source_fields(source_model, slug, secret))
        route_model.objects.create(
            source=source, event_pattern="*", queue=INGEST_QUEUE, kind="bench", title_template="PR {{ number }}"
        )
        return slug, secret

    def longpoll(self, base: str, api: h.Api) -> None:
        from todos import queue

        h.reset_todos()
        h.sb_sql(
            "INSERT INTO todos_queue (name, created_at) VALUES (%s, now()) ON CONFLICT DO NOTHING", [LONGPOLL_QUEUE]
        )
        t = time.monotonic()
        api.post("/api/v1/todos/claim/", {"queues": [LONGPOLL_QUEUE], "wait_seconds": 1})
        if time.monotonic() - t < 0.8:
            self.res.skip("long-poll wake latency", "claim with wait_seconds=1 on an empty queue returned at once")
            return
        print("long-poll wake latency", flush=True)
        waits: list[float] = []
        for _ in range(self.cfg.longpoll_samples):
            answered: dict[str, float] = {}

            def poll(answered: dict[str, float] = answered) -> None:
                poller = h.Api(base, self.token)
                poller.post("/api/v1/todos/claim/", {"queues": [LONGPOLL_QUEUE], "wait_seconds": 10, "limit": 1})
                answered["at"] = time.monotonic()
                poller.close()

            thread = threading.Thread(target=poll)
            thread.start()
            time.sleep(0.5)  # the claim is waiting now
            queue.create(queue=LONGPOLL_QUEUE, title="wake up")
            created = time.monotonic()
            thread.join(15)
            waits.append((answered.get("at", created + 10) - created) * 1000)
        self.res.add(
            Row(
                "long-poll wake: create -> waiting claim answers",
                1,
                [],
                ref=None,
                notes=f"p50 {h.percentile(waits, 50):.0f} ms, p99 {h.percentile(waits, 99):.0f} ms "
                f"({len(waits)} wakes)",
            )
        )


def _source_fields(model: Any, slug: str, secret: str) -> dict[str, Any]:
    """Source's secret field is ``secret`` (or ``secrets``, a list) depending on the ingest app."""
    names = {f.name for f in model._meta.get_fields()}
    fields: dict[str, Any] = {"slug": slug, "provider": "github"}
    if "secret" in names:
        fields["secret"] = secret
    else:
        fields["secrets"] = [secret]
    return fields


# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> tuple[Config, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one short run of every row: checks the harness")
    parser.add_argument("--runs", type=int, help="runs per row (median); default 3")
    parser.add_argument("--seconds", type=float, help="seconds per timed run of a claim+complete row; default 4")
    parser.add_argument("--jobs", type=int, help="jobs an alternative drains per run; default 3000")
    parser.add_argument("--soak-seconds", type=float, help="sustained-churn run length; default 45")
    parser.add_argument("--budget-minutes", type=float, help="time budget of the whole run; default 14")
    parser.add_argument("--clients", help="comma-separated client counts; default 1,4,16")
    parser.add_argument("--mode", choices=sorted(MODES), help="a named subset of sections (the Makefile's targets)")
    parser.add_argument("--only", help=f"comma-separated sections of {','.join(SECTIONS)}")
    parser.add_argument("--docs", action="store_true", help="rewrite docs/benchmarks.md's section and the plot")
    args = parser.parse_args(argv)
    cfg = Config()
    if args.quick:
        cfg = Config(
            runs=1,
            seconds=2,
            enqueue_seconds=2,
            jobs=400,
            history=(0, 10_000, 100_000),
            samples=200,
            soak_seconds=8,
            longpoll_samples=3,
        )
    for name in ("runs", "seconds", "jobs", "soak_seconds", "budget_minutes"):
        if getattr(args, name) is not None:
            setattr(cfg, name, getattr(args, name))
    if args.mode:
        cfg.only, cfg.clients = MODES[args.mode]
    if args.clients:
        cfg.clients = tuple(int(c) for c in args.clients.split(","))
    if args.only:
        cfg.only = tuple(args.only.split(","))
        unknown = set(cfg.only) - set(SECTIONS)
        if unknown:
            parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    return cfg, args


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(argv)
    started = time.monotonic()
    server = h.pg_server()
    machine = h.machine_summary(server)
    load_at_start = os.getloadavg()[0]
    print(f"machine: {machine}; load average {load_at_start:.1f}\nconfig: {asdict(cfg)}", flush=True)
    bench = Bench(cfg, server)
    bench.started = started
    bench.matrix()
    if "latency" in cfg.only:
        compare_history.latency(bench)
    if "soak" in cfg.only:
        compare_history.soak(bench)
    finish(bench.res)
    took = time.monotonic() - started
    # Other work on the machine moves every figure: the load average says how quiet it was.
    machine += f"; 1-minute load average {load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    print(f"\n{table(bench.res)}\n")
    for line in verdicts(bench.res, cfg.clients) + [f"skipped: {s}" for s in bench.res.skipped]:
        print(line)
    print(f"\ntook {took / 60:.1f} minutes")
    (h.out_dir() / "compare.json").write_text(
        json.dumps(
            {
                "machine": machine,
                "config": asdict(cfg),
                "rows": [asdict(r) for r in bench.res.rows],
                "skipped": bench.res.skipped,
            },
            indent=2,
        )
    )
    if args.docs:
        given = " ".join(sys.argv[1:] if argv is None else argv)
        command = f"python bench/compare/compare.py {given}"
        if os.environ.get("MAKELEVEL"):
            command = "make bench-compare" + ("" if given == "--docs" else f" BENCH_COMPARE_ARGS='{given}'")
        plot(bench.res, h.ROOT / "docs" / "img" / "throughput.png")
        section = docs_section(bench.res, cfg, machine, command, took, bench.rounds)
        write_docs(section, h.ROOT / "docs" / "benchmarks.md")
        print("wrote docs/benchmarks.md (## Against the alternatives) and docs/img/throughput.png")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
