"""Switchboard's side of bench/compare/compare.py: the bench agent, pgbench running todos/sql's statements,
and the forked client processes (in-process, HTTP, ingest) released together by a barrier."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import multiprocessing as mp
import re
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness as h

QUEUE = "bench"
ENQUEUE_QUEUE = "bench-enqueue"
LONGPOLL_QUEUE = "bench-longpoll"
INGEST_QUEUE = "bench-ingest"
AGENT = "bench"
ALTERNATIVES = {
    "procrastinate": ("Procrastinate 3.10 worker", "bench.compare.alt_settings.procrastinate"),
    "django_tasks": ("django-tasks-db 0.13 db_worker", "bench.compare.alt_settings.django_tasks"),
}


def make_agent() -> str:
    from todos.models import Agent

    Agent.objects.filter(name=AGENT).delete()
    agent = Agent(name=AGENT, claim_scopes=["bench*"], create_scopes=["bench*"])
    token = agent.set_new_token()
    agent.save()
    return token


# ---------------------------------------------------------------------------------------------
# The raw-SQL ceiling: pgbench running todos/sql's statements


def _sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, list | tuple):
        return "ARRAY[" + ",".join(_sql_literal(v) for v in value) + "]::text[]"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def _render(statement: str, params: dict[str, str]) -> str:
    """A todos/sql/ statement with its %(name)s placeholders replaced by SQL text for pgbench."""
    statement = re.sub(r"--[^\n]*", "", statement)
    return re.sub(r"%\((\w+)\)s", lambda m: params[m.group(1)], statement).strip()


def pgbench_statements(claim_like: list[str], visible_like: list[str]) -> tuple[str, str]:
    """The two pgbench scripts' text, from todos/sql's own statements: claim then complete (two
    transactions per job, as a worker runs them), and create. \\gset ends the claim and keeps its
    id and lease_id as :id and :lease_id for the complete."""
    from todos import sql
    from todos.models import glob_to_like

    claim = _render(
        sql.CLAIM_NEXT,
        {
            "scopes": _sql_literal(claim_like),
            "wanted": _sql_literal([glob_to_like(QUEUE)]),
            "agent": _sql_literal(AGENT),
            "owner": _sql_literal(f"{AGENT}/pgbench"),
            "limit": "1",
            "lease_seconds": "300",
        },
    )
    complete = _render(
        sql.COMPLETE,
        {
            "id": ":id",
            "lease_id": ":lease_id",
            "agent": _sql_literal(AGENT),
            "visible": _sql_literal(visible_like),
            "result": "NULL",
        },
    )
    # CREATE_MANY with one item (what queue.create runs): a JSON array of one object, defaults left out.
    one_item = (
        "json_build_array(json_build_object("
        "'id', 'td_' || md5(random()::text || clock_timestamp()::text), "
        f"'queue', {_sql_literal(ENQUEUE_QUEUE)}, 'source', 'bench', 'kind', 'noop', 'title', 'no-op', "
        "'idempotency_key', md5(random()::text || clock_timestamp()::text)))"
    )
    create = _render(sql.CREATE_MANY, {"items": one_item, "max_attempts": "5", "on_dependency_failure": "'cancel'"})
    return f"{claim}\n\\gset\n{complete};\n", f"{create};\n"


def pgbench_scripts() -> tuple[Path, Path]:
    from todos.models import Agent

    agent = Agent.objects.get(name=AGENT)
    claim, create = pgbench_statements(agent.claim_like_patterns(), agent.visible_like_patterns())
    out = h.out_dir()
    claim_path, create_path = out / "pgbench_claim_complete.sql", out / "pgbench_enqueue.sql"
    claim_path.write_text(claim)
    create_path.write_text(create)
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

    @contextlib.contextmanager
    def slot(self, i: int) -> Iterator[None]:
        """Worker ``i``'s run: what it raises is counted as an error (traceback printed) rather than
        left to hang the barrier's other parties, and the time it ended is kept."""
        try:
            yield
        except BaseException:
            self.errors[i] += 1
            traceback.print_exc()
        finally:
            self.ends[i] = time.monotonic()


@contextlib.contextmanager
def _closing_connections() -> Iterator[None]:
    from django.db import connections

    try:
        yield
    finally:
        connections.close_all()


def inproc_worker(slot: int, sh: Shared, mode: str, limit: int, prepared: bool = False) -> None:
    from django.db import connections

    from todos import queue
    from todos.models import Agent

    if prepared:
        # Django's psycopg backend binds parameters client-side and never prepares, so PostgreSQL parses
        # and plans CLAIM_NEXT (a five-CTE statement) on every call. With server-side binding and a
        # prepare threshold, psycopg prepares each statement after 5 uses.
        connections["default"].settings_dict["OPTIONS"].update(server_side_binding=True, prepare_threshold=5)
    with sh.slot(slot), _closing_connections():
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


def psycopg_worker(slot: int, sh: Shared, url: str, claim_like: list[str], visible_like: list[str]) -> None:
    """The same two statements from Python without Django: psycopg 3, prepared. It sits between
    pgbench (no client cost) and Switchboard (Django's cursor, the Todo rows): the gap to each says
    what the client language costs and what the framework costs."""
    import psycopg

    from todos import sql

    with sh.slot(slot), psycopg.connect(url, autocommit=True) as conn:
        claim = {
            "scopes": claim_like,
            "wanted": [QUEUE],
            "agent": AGENT,
            "owner": f"{AGENT}/psycopg{slot}",
            "limit": 1,
            "lease_seconds": 300.0,
        }
        sh.barrier.wait(120)
        end, n = sh.deadline.value, 0
        while time.monotonic() < end:
            cur = conn.execute(sql.CLAIM_NEXT, claim, prepare=True)
            row = cur.fetchone()
            if row is None:
                break
            names = [d.name for d in cur.description or []]
            receipt = {
                "id": row[names.index("id")],
                "lease_id": row[names.index("lease_id")],
                "agent": AGENT,
                "visible": visible_like,
                "result": None,
            }
            conn.execute(sql.COMPLETE, receipt, prepare=True)
            n += 1
            sh.counts[slot] = n


def http_worker(slot: int, sh: Shared, base: str, token: str, limit: int) -> None:
    api = h.Api(base, token)
    with sh.slot(slot), contextlib.closing(api):
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


def ingest_worker(slot: int, sh: Shared, base: str, slug: str, secret: str) -> None:
    api = h.Api(base)
    with sh.slot(slot), contextlib.closing(api):
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
