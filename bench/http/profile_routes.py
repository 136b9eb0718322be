#!/usr/bin/env python3
"""Where a hot route's server CPU goes: the server's own request cycle (switchboard/asgi.py's
PooledASGIHandler: create_request, then the sync path's ``_respond``, or the async chain for a long-poll
re-poll), run in this process without HTTP, under cProfile. Prints, per route, the CPU per request
(``time.process_time``; PostgreSQL's own work runs in its own process and is not counted) and the
functions with the most cumulative and own time.

    .venv/bin/python bench/http/profile_routes.py [--requests 300] [--top 25] [--routes claim,complete,...]

Routes: claim (POST /api/v1/todos/claim/), complete (POST /api/v1/todos/<id>/complete/), batch
(POST /api/v1/todos/complete/, 10 at a time), heartbeat (POST /api/v1/todos/<id>/heartbeat/), repoll
(a long-poll claim on an empty queue answered by its deadline: wait_seconds 0.001, through the async
chain). A scratch database, switchboard_bench_profile_routes, of the embedded server or DATABASE_URL's.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness

QUEUE = "bench.profile"
EMPTY = "bench.empty"
AGENT = "bench-profile"


def _scope(path: str, token: str, body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"authorization", f"Bearer {token}".encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--routes", default="claim,complete,batch,heartbeat,repoll")
    parser.add_argument("--sort", default="cumulative")
    args = parser.parse_args()
    n = args.requests

    harness.scratch_django("profile_routes")
    from todos.models import Agent

    Agent.objects.filter(name=AGENT).delete()
    agent = Agent(name=AGENT, claim_scopes=["bench.*"], create_scopes=["bench.*"])
    token = agent.set_new_token()
    agent.save()
    harness.reset_todos()
    harness.seed_todos(n * 50, queue=QUEUE)
    harness.seed_todos(1, queue=EMPTY, state="done", first=n * 20)
    harness.analyze()

    from switchboard.asgi import django_application as handler

    def _match(request: Any) -> tuple[Any, bool]:
        if hasattr(handler, "_match"):
            return handler._match(request)
        match = handler._async_match(request)  # type: ignore[attr-defined]  # an older tree (--before)
        return match, match is not None

    def sync_call(path: str, payload: Any) -> Any:
        body = json.dumps(payload).encode()
        request, _ = handler.create_request(_scope(path, token, body), io.BytesIO(body))
        assert request is not None
        request.resolver_match, _ = _match(request)
        response = handler._respond(request, {})
        content = getattr(response, "content", b"")
        assert response.status_code == 200, (path, response.status_code, content[:300])
        return json.loads(content)

    def repoll() -> Any:
        body = json.dumps({"queues": [EMPTY], "wait_seconds": 0.001}).encode()
        path = "/api/v1/todos/claim/"
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async def run() -> None:
            scope = _scope(path, token, body)
            request, _ = handler.create_request(scope, io.BytesIO(body))
            assert request is not None
            match, runs_async = _match(request)
            assert runs_async, "the long-poll did not take the async path"
            request.resolver_match = match
            await handler._handle_async(request, scope, receive, send)

        asyncio.run(run())
        assert sent and sent[0]["status"] == 200, sent[:1]

    def claims(k: int) -> list[dict[str, Any]]:
        return [sync_call("/api/v1/todos/claim/", {"queues": [QUEUE]})["todos"][0] for _ in range(k)]

    plans: dict[str, Callable[[], Callable[[int], None]]] = {}

    def plan_claim() -> Callable[[int], None]:
        return lambda i: sync_call("/api/v1/todos/claim/", {"queues": [QUEUE]})

    def plan_complete() -> Callable[[int], None]:
        todos = claims(n + 5)
        return lambda i: sync_call(f"/api/v1/todos/{todos[i]['id']}/complete/", {"lease_id": todos[i]["lease_id"]})

    def plan_heartbeat() -> Callable[[int], None]:
        todos = claims(5)
        return lambda i: sync_call(
            f"/api/v1/todos/{todos[i % 5]['id']}/heartbeat/", {"lease_id": todos[i % 5]["lease_id"]}
        )

    def plan_batch() -> Callable[[int], None]:
        todos = claims(10 * (n + 5))

        def call(i: int) -> None:
            chunk = todos[10 * i : 10 * i + 10]
            items = [{"id": t["id"], "lease_id": t["lease_id"]} for t in chunk]
            sync_call("/api/v1/todos/complete/", {"items": items})

        return call

    def plan_repoll() -> Callable[[int], None]:
        return lambda i: repoll()

    plans = {
        "claim": plan_claim,
        "complete": plan_complete,
        "batch": plan_batch,
        "heartbeat": plan_heartbeat,
        "repoll": plan_repoll,
    }
    summary: list[str] = []
    for route in args.routes.split(","):
        call = plans[route]()
        for i in range(3):  # warm: connections, caches, imports
            call(i)
        call = plans[route]()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for i in range(n):
            call(i)
        cpu, wall = (time.process_time() - cpu0) / n, (time.perf_counter() - wall0) / n
        call = plans[route]()
        profile = cProfile.Profile()
        profile.enable()
        for i in range(n):
            call(i)
        profile.disable()
        line = f"{route}: {cpu * 1000:.2f} ms CPU / {wall * 1000:.2f} ms wall per request (no profiler)"
        summary.append(line)
        print(f"\n===== {line}")
        stats = pstats.Stats(profile)
        stats.sort_stats(args.sort).print_stats(args.top)
        stats.sort_stats("tottime").print_stats(args.top)
    print("\n".join(["", *summary]))


if __name__ == "__main__":
    main()
