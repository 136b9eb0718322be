"""Switchboard against the raw-SQL ceiling and the alternatives a Django user would pick, in one run.

    make bench-compare                      # the full run (about 12 minutes on 2 cores)
    .venv/bin/python bench/compare.py --quick                       # every row once, short: a check
    .venv/bin/python bench/compare.py --only raw,inproc --seconds 30   # long runs: see autovacuum work

Everything runs in dedicated databases (switchboard_bench, switchboard_bench_procrastinate,
switchboard_bench_django_tasks) on the embedded PostgreSQL, or on the server of DATABASE_URL.
Each row is the median of --runs runs in jobs/s, with its ratio to the raw-SQL ceiling: pgbench
running todos/sql.py's own CLAIM_NEXT and COMPLETE (or CREATE) statements on the same table with
the same number of clients. --docs rewrites the "## Against the alternatives" section of
docs/benchmarks.md and docs/img/throughput.png from the run.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness as h

QUEUE = "bench"
ENQUEUE_QUEUE = "bench-enqueue"
LONGPOLL_QUEUE = "bench-longpoll"
INGEST_QUEUE = "bench-ingest"
AGENT = "bench"
SB_DB = "switchboard_bench"
ALTERNATIVES = {
    "procrastinate": ("Procrastinate 3.10 worker", "bench.alt_settings.procrastinate"),
    "django_tasks": ("django-tasks-db 0.13 db_worker", "bench.alt_settings.django_tasks"),
}
SECTIONS = (
    "raw",
    "inproc",
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


@dataclass
class Config:
    clients: tuple[int, ...] = (1, 4, 16)
    runs: int = 3
    seconds: float = 8.0  # one timed run of a claim+complete row
    enqueue_seconds: float = 4.0
    jobs: int = 4000  # jobs drained per run by an alternative
    batch_clients: tuple[int, ...] = (4,)
    history: tuple[int, ...] = (0, 100_000, 1_000_000)
    samples: int = 1000  # claim+complete cycles timed per history size
    soak_seconds: float = 60.0
    soak_clients: int = 16
    ingest_clients: tuple[int, ...] = (4, 16)
    longpoll_samples: int = 20
    only: tuple[str, ...] = SECTIONS


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
# The Switchboard database: seeding and resetting with set-based SQL (fast, and beside the point)


def sb_sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def reset_todos() -> None:
    sb_sql("TRUNCATE todos_todo")


def seed(n: int, *, queue: str = QUEUE, state: str = "pending") -> None:
    """n todos in one statement; created_at ascends so claims take them in order."""
    if n <= 0:
        return
    sb_sql("INSERT INTO todos_queue (name, created_at) VALUES (%s, now()) ON CONFLICT DO NOTHING", [queue])
    done = state == "done"
    sb_sql(
        f"""
        INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
            result, created_at, updated_at, claimed_at, completed_at, owner)
        SELECT 'td_' || md5(g::text || random()::text), %s, 'bench', 'noop', 'no-op', '{{}}'::jsonb, %s,
            {1 if done else 0}, 5, '[]'::jsonb, NULL,
            now() - interval '1 hour' + g * interval '1 microsecond', now(),
            {"now()" if done else "NULL"}, {"now()" if done else "NULL"}, {"'bench'" if done else "NULL"}
        FROM generate_series(1, %s) g
        """,
        [queue, state, n],
    )


def analyze() -> None:
    sb_sql("VACUUM ANALYZE todos_todo")


def make_agent() -> str:
    from todos.models import Agent

    Agent.objects.filter(name=AGENT).delete()
    agent = Agent(name=AGENT, claim_scopes=["bench*"], create_scopes=["bench*"])
    token = agent.set_new_token()
    agent.save()
    return token


# ---------------------------------------------------------------------------------------------
# The raw-SQL ceiling: pgbench running todos/sql.py's statements


def _sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, list | tuple):
        return "ARRAY[" + ",".join(_sql_literal(v) for v in value) + "]::text[]"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def _render(statement: str, params: dict[str, str]) -> str:
    """A todos/sql.py statement with its %(name)s placeholders replaced by SQL text for pgbench."""
    statement = re.sub(r"--[^\n]*", "", statement)
    return re.sub(r"%\((\w+)\)s", lambda m: params[m.group(1)], statement).strip()


def pgbench_scripts() -> tuple[Path, Path]:
    from todos import sql
    from todos.models import Agent, glob_to_like

    agent = Agent.objects.get(name=AGENT)
    visible = _sql_literal(agent.visible_like_patterns())
    claim = _render(
        sql.CLAIM_NEXT,
        {
            "scopes": _sql_literal(agent.claim_like_patterns()),
            "wanted": _sql_literal([glob_to_like(QUEUE)]),
            "agent": _sql_literal(AGENT),
            "owner": _sql_literal(f"{AGENT}/pgbench"),
            "limit": "1",
            "lease_seconds": "300",
        },
    )
    complete = _render(
        sql.COMPLETE,
        {"id": ":id", "lease_id": ":lease_id", "agent": _sql_literal(AGENT), "visible": visible, "result": "NULL"},
    )
    create = _render(
        sql.CREATE,
        {
            "id": "'td_' || md5(random()::text || clock_timestamp()::text)",
            "queue": _sql_literal(ENQUEUE_QUEUE),
            "source": "'bench'",
            "kind": "'noop'",
            "title": "'no-op'",
            "payload": "'{}'::jsonb",
            "event_id": "NULL",
            "idempotency_key": "md5(random()::text || clock_timestamp()::text)",
            "assignee": "NULL",
            "max_attempts": "5",
        },
    )
    out = h.out_dir()
    claim_path, create_path = out / "pgbench_claim_complete.sql", out / "pgbench_enqueue.sql"
    # \gset ends the claim and keeps its id and lease_id for the complete: two transactions per job,
    # exactly as a worker runs them.
    claim_path.write_text(f"{claim}\n\\gset\n{complete};\n")
    create_path.write_text(f"{create};\n")
    return claim_path, create_path


def pgbench(url: str, script: Path, clients: int, seconds: float) -> tuple[float, str]:
    cmd = [
        str(h.pg_bin("pgbench")),
        "-n",
        "-M",
        "prepared",
        "-c",
        str(clients),
        "-j",
        str(min(clients, 4)),
        "-T",
        str(max(1, round(seconds))),
        "-f",
        str(script),
        url,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", done.stdout)
    if done.returncode != 0 or not match:
        raise RuntimeError(f"pgbench failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    warn = "clients aborted (queue ran dry?)" if "aborted" in (done.stdout + done.stderr) else ""
    return float(match.group(1)), warn


# ---------------------------------------------------------------------------------------------
# Switchboard in-process and over HTTP: N forked processes released together by a barrier


@dataclass
class Shared:
    barrier: Any
    deadline: Any
    counts: Any
    ends: Any
    errors: Any


def _inproc_worker(slot: int, sh: Shared, mode: str, limit: int, server_side_binding: bool = False) -> None:
    from django.db import connections

    from todos import queue
    from todos.models import Agent

    if server_side_binding:
        # Django's psycopg backend binds parameters client-side by default, so PostgreSQL parses and
        # plans CLAIM_NEXT on every call; with server-side binding psycopg prepares it after 5 uses.
        connections["default"].settings_dict["OPTIONS"]["server_side_binding"] = True
    try:
        agent = Agent.objects.get(name=AGENT)
        sh.barrier.wait(120)
        end, n = sh.deadline.value, 0
        while time.monotonic() < end:
            if mode == "enqueue":
                queue.create(
                    queue=ENQUEUE_QUEUE, source="bench", kind="noop", title="no-op", idempotency_key=uuid.uuid4().hex
                )
                n += 1
            else:
                todos = queue.claim_next(agent=agent, queues=[QUEUE], limit=limit, lease_seconds=300)
                if not todos:
                    break
                if limit == 1:
                    queue.complete(todos[0].id, agent=agent, lease_id=todos[0].lease_id)
                else:
                    queue.complete_many([(t.id, t.lease_id, None) for t in todos], agent=agent)
                n += len(todos)
            sh.counts[slot] = n
    except BaseException:
        sh.errors[slot] += 1
        traceback.print_exc()
    finally:
        sh.ends[slot] = time.monotonic()
        connections.close_all()


def _http_worker(slot: int, sh: Shared, base: str, token: str, limit: int) -> None:
    api = h.Api(base, token)
    try:
        sh.barrier.wait(120)
        end, n = sh.deadline.value, 0
        while time.monotonic() < end and sh.errors[slot] < 20:
            status, body = api.post(
                "/api/v1/todos/claim/", {"queues": [QUEUE], "limit": limit, "lease_seconds": 300, "worker": f"w{slot}"}
            )
            if status != 200:
                sh.errors[slot] += 1
                continue
            todos = body["todos"]
            if not todos:
                break
            if limit == 1:
                status, _ = api.post(f"/api/v1/todos/{todos[0]['id']}/complete/", {"lease_id": todos[0]["lease_id"]})
                n += status == 200
            else:
                items = [{"id": t["id"], "lease_id": t["lease_id"]} for t in todos]
                status, _ = api.post("/api/v1/todos/complete/", {"items": items})
                n += len(todos) if status == 200 else 0
            sh.errors[slot] += status != 200
            sh.counts[slot] = n
    except BaseException:
        sh.errors[slot] += 1
        traceback.print_exc()
    finally:
        sh.ends[slot] = time.monotonic()
        api.close()


def _ingest_worker(slot: int, sh: Shared, base: str, slug: str, secret: str) -> None:
    api = h.Api(base)
    try:
        sh.barrier.wait(120)
        end, n = sh.deadline.value, 0
        while time.monotonic() < end and sh.errors[slot] < 20:
            status, _ = api.post(
                f"/ingest/{slug}/", raw=_github_body(slot, n), headers=_github_headers(secret, slot, n)
            )
            if 200 <= status < 300:
                n += 1
                sh.counts[slot] = n
            else:
                sh.errors[slot] += 1
    except BaseException:
        sh.errors[slot] += 1
        traceback.print_exc()
    finally:
        sh.ends[slot] = time.monotonic()
        api.close()


def _github_body(slot: int, n: int) -> bytes:
    return json.dumps({"action": "opened", "number": n, "sender": {"login": f"bench{slot}"}}).encode()


def _github_headers(secret: str, slot: int, n: int) -> dict[str, str]:
    body = _github_body(slot, n)
    return {
        "X-GitHub-Event": "pull_request",
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest(),
    }


@dataclass
class ProcRun:
    total: int
    elapsed: float
    errors: int
    timeline: list[tuple[float, int, dict[str, Any]]]

    @property
    def rate(self) -> float:
        return self.total / self.elapsed if self.elapsed > 0 else 0.0


def run_processes(
    target: Callable[..., None], n: int, seconds: float, *args: Any, sample: Callable[[], dict[str, Any]] | None = None
) -> ProcRun:
    """Fork n workers, release them together, let them run ``seconds`` (or until the queue is empty)."""
    from django.db import connections

    connections.close_all()
    ctx = mp.get_context("fork")
    sh = Shared(
        barrier=ctx.Barrier(n + 1),
        deadline=ctx.Value("d", 0.0, lock=False),
        counts=ctx.Array("q", n, lock=False),
        ends=ctx.Array("d", n, lock=False),
        errors=ctx.Array("q", n, lock=False),
    )
    procs = [ctx.Process(target=target, args=(i, sh, *args), daemon=True) for i in range(n)]
    for p in procs:
        p.start()
    sh.deadline.value = time.monotonic() + seconds
    sh.barrier.wait(120)
    started = time.monotonic()
    sh.deadline.value = started + seconds
    timeline: list[tuple[float, int, dict[str, Any]]] = []
    while any(p.is_alive() for p in procs):
        time.sleep(1.0 if sample else 0.1)
        if sample:
            timeline.append((time.monotonic() - started, sum(sh.counts), sample()))
    for p in procs:
        p.join()
    elapsed = max(sh.ends) - started
    return ProcRun(total=sum(sh.counts), elapsed=elapsed, errors=sum(sh.errors), timeline=timeline)


# ---------------------------------------------------------------------------------------------
# Sections


class Bench:
    def __init__(self, cfg: Config, server: h.PgServer) -> None:
        self.cfg = cfg
        self.server = server
        self.res = Results()
        self.sb_url = server.create_database(SB_DB)
        h.migrate(self.sb_url)
        h.setup_django(self.sb_url)
        self.token = make_agent()
        self.claim_script, self.enqueue_script = pgbench_scripts()
        # The most any client count has done so far: sizes the backlog seeded for the next run.
        self.best = 0.0

    def backlog(self, seconds: float) -> int:
        return int(max(self.best, 3000) * seconds * 1.6) + 5000

    # -- the ceiling ----------------------------------------------------------------------------
    def raw(self) -> None:
        print("raw SQL (pgbench, todos/sql.py statements)", flush=True)
        for clients in self.cfg.clients:
            runs, warns = [], set()
            for _ in range(self.cfg.runs):
                reset_todos()
                seed(max(self.backlog(self.cfg.seconds), int(12000 * self.cfg.seconds)))
                analyze()
                tps, warn = pgbench(self.sb_url, self.claim_script, clients, self.cfg.seconds)
                runs.append(tps)
                warns.add(warn)
                self.best = max(self.best, tps)
            self.res.add(
                Row("raw SQL claim, then complete (pgbench)", clients, runs, series="raw-claim", notes=" ".join(warns))
            )
        if "enqueue" in self.cfg.only:
            for clients in self.cfg.clients:
                runs = []
                for _ in range(self.cfg.runs):
                    reset_todos()
                    tps, _ = pgbench(self.sb_url, self.enqueue_script, clients, self.cfg.enqueue_seconds)
                    runs.append(tps)
                self.res.add(
                    Row(
                        "raw SQL enqueue, CREATE with a key (pgbench)",
                        clients,
                        runs,
                        ref="enqueue",
                        series="raw-enqueue",
                    )
                )

    # -- Switchboard in-process ---------------------------------------------------------------
    def _inproc_rows(self, clients: int, limit: int, server_side_binding: bool = False) -> list[float]:
        runs = []
        for _ in range(self.cfg.runs):
            reset_todos()
            seed(self.backlog(self.cfg.seconds) * (3 if limit > 1 else 1))
            analyze()
            run = run_processes(_inproc_worker, clients, self.cfg.seconds, "claim", limit, server_side_binding)
            if run.errors:
                raise RuntimeError(f"{run.errors} in-process worker errors (tracebacks above)")
            runs.append(run.rate)
            self.best = max(self.best, run.rate)
        return runs

    def inproc(self) -> None:
        print("Switchboard in-process (todos/queue.py claim_next + complete, one process per client)", flush=True)
        for clients in self.cfg.clients:
            runs = self._inproc_rows(clients, 1)
            self.res.add(Row("Switchboard in-process, claim_next + complete", clients, runs, series="inproc"))
        if "prepared" in self.cfg.only:
            for clients in self.cfg.clients:
                runs = self._inproc_rows(clients, 1, server_side_binding=True)
                self.res.add(
                    Row(
                        "Switchboard in-process, server-side binding (prepared)",
                        clients,
                        runs,
                        series="inproc-prepared",
                        notes="DATABASES OPTIONS server_side_binding=True",
                    )
                )
        if "enqueue" in self.cfg.only:
            for clients in self.cfg.clients:
                runs = []
                for _ in range(self.cfg.runs):
                    reset_todos()
                    run = run_processes(_inproc_worker, clients, self.cfg.enqueue_seconds, "enqueue", 1)
                    runs.append(run.rate)
                self.res.add(Row("Switchboard in-process, create with a key", clients, runs, ref="enqueue"))

    def batch(self) -> None:
        print("Switchboard in-process, batch claims", flush=True)
        for limit in (10, 100):
            for clients in self.cfg.batch_clients:
                runs = self._inproc_rows(clients, limit)
                self.res.add(Row(f"Switchboard in-process, claim_next(limit={limit}) + complete_many", clients, runs))

    # -- Switchboard over HTTP ----------------------------------------------------------------
    def http(self) -> None:
        print("Switchboard over HTTP (gunicorn, the project's gunicorn.conf.py)", flush=True)
        with h.gunicorn(self.sb_url) as base:
            api = h.Api(base, self.token)
            status, body = api.post("/api/v1/todos/claim/", {"queues": [QUEUE]})
            if status != 200 or not isinstance(body, dict) or "todos" not in body:
                self.res.skip("Switchboard over HTTP", f"POST /api/v1/todos/claim/ answered {status}, not the API")
                self.res.skip("long-poll wake latency", "no claim endpoint")
                self.ingest(base, api_missing=True)
                return
            batch_ok = api.post("/api/v1/todos/complete/", {"items": []})[0] not in (404, 405)
            for clients in self.cfg.clients:
                self.res.add(
                    Row(
                        "Switchboard over HTTP, claim + complete",
                        clients,
                        self._http_runs(base, clients, 1),
                        series="http",
                    )
                )
            for limit in (10, 100):
                if not batch_ok:
                    self.res.skip(f"HTTP batch limit={limit}", "POST /api/v1/todos/complete/ is missing")
                    continue
                for clients in self.cfg.batch_clients:
                    runs = self._http_runs(base, clients, limit)
                    self.res.add(Row(f"Switchboard over HTTP, claim limit={limit} + batch complete", clients, runs))
            self.longpoll(base, api)
            self.ingest(base)

    def _http_runs(self, base: str, clients: int, limit: int) -> list[float]:
        runs = []
        for _ in range(self.cfg.runs):
            reset_todos()
            seed(int(self.backlog(self.cfg.seconds) * (3 if limit > 1 else 0.5)))
            analyze()
            run = run_processes(_http_worker, clients, self.cfg.seconds, base, self.token, limit)
            if run.errors:
                print(f"    {run.errors} HTTP errors in this run", flush=True)
            runs.append(run.rate)
        return runs

    def longpoll(self, base: str, api: h.Api) -> None:
        if "ingest" not in self.cfg.only and "http" not in self.cfg.only:
            return
        from todos import queue

        reset_todos()
        sb_sql("INSERT INTO todos_queue (name, created_at) VALUES (%s, now()) ON CONFLICT DO NOTHING", [LONGPOLL_QUEUE])
        t = time.monotonic()
        api.post("/api/v1/todos/claim/", {"queues": [LONGPOLL_QUEUE], "wait_seconds": 1})
        if time.monotonic() - t < 0.8:
            self.res.skip("long-poll wake latency", "claim with wait_seconds=1 on an empty queue returned at once")
            return
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

    def ingest(self, base: str, api_missing: bool = False) -> None:
        if "ingest" not in self.cfg.only:
            return
        from django.apps import apps
        from django.urls import Resolver404, resolve

        try:
            resolve("/ingest/bench/")
            source_model = apps.get_model("ingest", "Source")
            route_model = apps.get_model("ingest", "Route")
        except (Resolver404, LookupError):
            self.res.skip("ingest deliveries/s", "no /ingest/<slug>/ view or ingest.Source/Route models yet")
            return
        secret = "bench-secret-" + uuid.uuid4().hex
        slug = "bench-github"
        source_model.objects.filter(slug=slug).delete()
        source = source_model.objects.create(**_source_fields(source_model, slug, secret))
        route_model.objects.create(
            source=source, event_pattern="*", queue=INGEST_QUEUE, kind="bench", title_template="PR {{ number }}"
        )
        for clients in self.cfg.ingest_clients:
            runs = []
            for _ in range(self.cfg.runs):
                run = run_processes(_ingest_worker, clients, self.cfg.enqueue_seconds, base, slug, secret)
                if run.errors:
                    print(f"    {run.errors} ingest errors in this run", flush=True)
                runs.append(run.rate)
            self.res.add(
                Row(
                    "ingest: signed GitHub deliveries -> event + todo",
                    clients,
                    runs,
                    ref="enqueue",
                    notes="deliveries/s",
                )
            )

    # -- the alternatives ---------------------------------------------------------------------
    def alternative(self, name: str) -> None:
        label, settings_module = ALTERNATIVES[name]
        print(f"{label} (its own worker, no-op jobs)", flush=True)
        url = self.server.create_database(f"{SB_DB}_{name}")
        h.migrate(url, settings_module)
        enqueue_rates = []
        for clients in self.cfg.clients:
            procs, concurrency = _alt_plan(name, clients)
            runs = []
            for _ in range(self.cfg.runs):
                rate, enqueue_rate = _alt_drain(name, url, settings_module, procs, concurrency, self.cfg.jobs)
                runs.append(rate)
                enqueue_rates.append(enqueue_rate)
            shape = (
                f"{procs} process{'es' if procs > 1 else ''} x {concurrency}"
                if name == "procrastinate"
                else (f"{procs} process{'es' if procs > 1 else ''}")
            )
            self.res.add(Row(label, clients, runs, series=name, notes=f"{shape}; drains {self.cfg.jobs} jobs"))
        enqueue_label = "Procrastinate defer()" if name == "procrastinate" else "django-tasks enqueue()"
        self.res.add(
            Row(
                f"{enqueue_label}, one by one in one transaction",
                1,
                enqueue_rates,
                ref="enqueue",
                notes="median of every run's enqueue",
            )
        )

    # -- history must not slow claims -----------------------------------------------------------
    def latency(self) -> None:
        from todos import queue
        from todos.models import Agent

        print("claim latency beside done history (one client, in-process)", flush=True)
        agent = Agent.objects.get(name=AGENT)
        for done_rows in self.cfg.history:
            reset_todos()
            seed(done_rows, state="done")
            seed(10)
            analyze()
            for _ in range(50):  # warm-up
                self._cycle(queue, agent)
            times = [self._cycle(queue, agent) for _ in range(self.cfg.samples)]
            rate = len(times) / sum(times)
            self.res.add(
                Row(
                    f"claim + complete beside {done_rows:,} done rows",
                    1,
                    [rate],
                    notes=f"p50 {h.percentile(times, 50) * 1000:.2f} ms, p99 {h.percentile(times, 99) * 1000:.2f} ms",
                )
            )

    @staticmethod
    def _cycle(queue: Any, agent: Any) -> float:
        started = time.perf_counter()
        todo = queue.claim_next(agent=agent, queues=[QUEUE], lease_seconds=300)[0]
        queue.complete(todo.id, agent=agent, lease_id=todo.lease_id)
        took = time.perf_counter() - started
        seed(1)  # keep a handful pending (untimed)
        return took

    # -- autovacuum under sustained churn (SPEC trap 3) ---------------------------------------------
    def soak(self) -> None:
        import psycopg

        clients, seconds = self.cfg.soak_clients, self.cfg.soak_seconds
        print(f"sustained churn: {clients} in-process clients for {seconds:.0f} s (autovacuum, SPEC trap 3)")
        reset_todos()
        seed(self.backlog(seconds))
        analyze()
        with psycopg.connect(self.sb_url, autocommit=True) as conn:

            def sample() -> dict[str, Any]:
                row = conn.execute(
                    "SELECT n_dead_tup, autovacuum_count FROM pg_stat_user_tables WHERE relname = 'todos_todo'"
                ).fetchone()
                return {"dead": row[0], "autovacuums": row[1]} if row else {}

            before = sample()
            run = run_processes(_inproc_worker, clients, seconds, "claim", 1, sample=sample)
        window = min(10.0, seconds / 3)
        first = _window_rate(run.timeline, 0, window)
        last = _window_rate(run.timeline, run.elapsed - window, run.elapsed)
        dead = max((s.get("dead", 0) for _, _, s in run.timeline), default=0)
        vacuums = (run.timeline[-1][2].get("autovacuums", 0) - before.get("autovacuums", 0)) if run.timeline else 0
        self.res.add(
            Row(
                f"Switchboard in-process, sustained {seconds:.0f} s",
                clients,
                [run.rate],
                notes=f"first {window:.0f} s {first:,.0f}/s, last {window:.0f} s {last:,.0f}/s; "
                f"autovacuum ran {vacuums}x, dead tuples peaked at {dead:,}",
            )
        )


def _window_rate(timeline: list[tuple[float, int, dict[str, Any]]], start: float, end: float) -> float:
    inside = [(t, n) for t, n, _ in timeline if start - 0.5 <= t <= end + 0.5]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return float("nan")
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def _source_fields(model: Any, slug: str, secret: str) -> dict[str, Any]:
    """Source's secret field is ``secret`` (or ``secrets``, a list) depending on the ingest app."""
    names = {f.name for f in model._meta.get_fields()}
    fields: dict[str, Any] = {"slug": slug, "provider": "github"}
    if "secret" in names:
        fields["secret"] = secret
    else:
        fields["secrets"] = [secret]
    return fields


def _alt_plan(name: str, clients: int) -> tuple[int, int]:
    """(processes, concurrency per process) matching ``clients`` for an alternative's own worker.
    Procrastinate is async: one process runs several jobs at once, so it gets 1 x 1, 1 x 4, 2 x 8 (its
    own advice: processes up to the cores, concurrency within). django-tasks' db_worker runs one job
    at a time, so it gets one process per client."""
    if name == "procrastinate":
        procs = 1 if clients <= 4 else 2
        return procs, clients // procs
    return clients, 1


_ALT_SQL = {
    "procrastinate": {
        "reset": "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers CASCADE",
        "left": "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
        "span": """SELECT count(*) FILTER (WHERE type = 'succeeded'), min(at) FILTER (WHERE type = 'started'),
                   max(at) FILTER (WHERE type = 'succeeded') FROM procrastinate_events""",
        "ready": "SELECT count(*) FROM procrastinate_workers",
    },
    "django_tasks": {
        "reset": "TRUNCATE django_tasks_database_dbtaskresult",
        "left": "SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status IN ('READY', 'RUNNING')",
        "span": """SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), min(started_at), max(finished_at)
                   FROM django_tasks_database_dbtaskresult""",
        # One connection per worker once it polls.
        "ready": """SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                    AND pid <> pg_backend_pid() AND backend_type = 'client backend'""",
    },
}


def _alt_worker_cmd(name: str, concurrency: int) -> list[str]:
    if name == "procrastinate":
        return [h.PYTHON, "-m", "django", "procrastinate", "worker", "--concurrency", str(concurrency)]
    # --interval is the idle poll: 0.1 s so that every worker starts within 0.1 s of the jobs appearing.
    return [h.PYTHON, "-m", "django", "db_worker", "--interval", "0.1", "--no-startup-delay", "--no-reload", "-v", "0"]


def _alt_drain(
    name: str, url: str, settings_module: str, procs: int, concurrency: int, jobs: int
) -> tuple[float, float]:
    """Start the workers, wait until all are up, enqueue ``jobs`` at once, time the drain.
    Returns (jobs/s from the first start to the last finish, by the library's own timestamps;
    enqueue jobs/s)."""
    import psycopg

    q = _ALT_SQL[name]
    env = h.project_env(url, DJANGO_SETTINGS_MODULE=settings_module)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(q["reset"])
        logs = [open(h.out_dir() / f"{name}-worker-{i}.log", "w") for i in range(procs)]
        workers = [
            subprocess.Popen(
                _alt_worker_cmd(name, concurrency), cwd=h.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
            for log in logs
        ]
        try:
            _wait_for(lambda: conn.execute(q["ready"]).fetchone()[0] >= procs, 60, f"{name} workers to start")  # type: ignore[index]
            done = subprocess.run(
                [h.PYTHON, "-m", "bench.alt_enqueue", name, str(jobs)],
                cwd=h.ROOT,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            enqueued = json.loads(done.stdout.strip().splitlines()[-1])
            _wait_for(lambda: conn.execute(q["left"]).fetchone()[0] == 0, 600, f"{name} to drain")  # type: ignore[index]
            succeeded, first, last = conn.execute(q["span"]).fetchone()  # type: ignore[misc]
        finally:
            for w in workers:
                w.terminate()
            for w in workers:
                try:
                    w.wait(15)
                except subprocess.TimeoutExpired:
                    w.kill()
            for log in logs:
                log.close()
    if succeeded != jobs:
        raise RuntimeError(f"{name}: {succeeded} of {jobs} jobs succeeded")
    return jobs / (last - first).total_seconds(), enqueued["n"] / enqueued["seconds"]


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


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
    ahead, ratios = [], []
    for c in clients:
        sb = by.get(("inproc", c))
        if not sb:
            continue
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
    return out


def plot(res: Results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {
        "raw-claim": "raw SQL (pgbench)",
        "inproc": "Switchboard in-process",
        "inproc-prepared": "Switchboard in-process, server-side binding",
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


def docs_section(res: Results, cfg: Config, machine: str, command: str, seconds: float) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "## Against the alternatives",
        "",
        f"Measured {when} with `{command}` ({seconds / 60:.1f} minutes) on {machine}.",
        f"Each row is the median of {cfg.runs} run(s); the ratio is to the raw-SQL ceiling at the same client count",
        "(pgbench running `todos/sql.py`'s own CLAIM_NEXT then COMPLETE, two transactions per job, or CREATE for",
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
        "  `bench/alt_settings/` and its own database.",
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


# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> tuple[Config, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one short run of every row: checks the harness")
    parser.add_argument("--runs", type=int, help="runs per row (median); default 3")
    parser.add_argument("--seconds", type=float, help="seconds per timed run of a claim+complete row; default 8")
    parser.add_argument("--jobs", type=int, help="jobs an alternative drains per run; default 4000")
    parser.add_argument("--soak-seconds", type=float, help="sustained-churn run length; default 60")
    parser.add_argument("--clients", help="comma-separated client counts; default 1,4,16")
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
    for name in ("runs", "seconds", "jobs", "soak_seconds"):
        if getattr(args, name) is not None:
            setattr(cfg, name, getattr(args, name))
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
    print(f"machine: {machine}\nconfig: {asdict(cfg)}", flush=True)
    bench = Bench(cfg, server)
    only = set(cfg.only)
    # The ceiling first: every other row's ratio and backlog size come from it.
    if only & {"raw", "inproc", "batch", "http", "procrastinate", "django_tasks", "latency", "soak", "ingest"}:
        bench.raw()
    for section, run in (
        ("inproc", bench.inproc),
        ("batch", bench.batch),
        ("http", bench.http),
        ("procrastinate", lambda: bench.alternative("procrastinate")),
        ("django_tasks", lambda: bench.alternative("django_tasks")),
        ("latency", bench.latency),
        ("soak", bench.soak),
    ):
        if section in only:
            run()
    if "ingest" in only and "http" not in only:
        with h.gunicorn(bench.sb_url) as base:
            bench.longpoll(base, h.Api(base, bench.token))
            bench.ingest(base)
    finish(bench.res)
    took = time.monotonic() - started
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
        command = "make bench-compare" if os.environ.get("MAKELEVEL") else f"python bench/compare.py {given}"
        plot(bench.res, h.ROOT / "docs" / "img" / "throughput.png")
        write_docs(docs_section(bench.res, cfg, machine, command, took), h.ROOT / "docs" / "benchmarks.md")
        print("wrote docs/benchmarks.md (## Against the alternatives) and docs/img/throughput.png")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
