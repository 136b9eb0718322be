"""Slow worker drill: a worker that misses its heartbeats loses the lease, another worker claims and
finishes the todo, and the slow one's late complete (and heartbeat) gets 409 and changes nothing.

In-process through todos/queue/ first (conflict is TodoConflict there), then over HTTP (409).

    python -m bench.drills.slow_worker [--lease 1]
"""

from __future__ import annotations

import argparse
import time

from bench import harness as h
from bench.drills import common as c

QUEUE = "drill-slow"


def in_process(lease: float) -> None:
    from todos import queue
    from todos.errors import TodoConflict
    from todos.models import Agent

    agent = Agent.objects.get(name="drill")
    todo, _ = queue.create(queue=QUEUE, title="slow worker, in-process")
    slow = queue.claim_next(agent=agent, queues=[QUEUE], lease_seconds=lease, worker="slow")[0]
    time.sleep(lease + 0.5)  # the slow worker misses its heartbeat
    fast = queue.claim_next(agent=agent, queues=[QUEUE], lease_seconds=30, worker="fast")
    c.check([t.id for t in fast] == [todo.id], "another worker claims the lapsed todo")
    queue.complete(todo.id, agent=agent, lease_id=fast[0].lease_id, result={"by": "fast"})
    outcomes = []
    for action in (queue.heartbeat, queue.complete):
        try:
            action(todo.id, agent=agent, lease_id=slow.lease_id)
            outcomes.append("accepted")
        except TodoConflict as exc:
            outcomes.append(f"conflict ({exc.state})")
    todo.refresh_from_db()
    c.figure(
        f"in-process: slow heartbeat -> {outcomes[0]}, slow complete -> {outcomes[1]}; "
        f"todo {todo.state}, result {todo.result}, attempt {todo.attempt}"
    )
    c.check(
        outcomes == ["conflict (done)", "conflict (done)"], "the slow worker's late heartbeat and complete conflict"
    )
    c.check(todo.state == "done" and todo.result == {"by": "fast"}, "the fast worker's result stands")
    c.check(any(e["error"] == "lease expired" for e in todo.errors), "the lapse is in the error history")


def over_http(db: c.DrillDb, token: str, lease: float) -> None:
    from todos import queue
    from todos.models import Todo

    with db.gunicorn() as base:
        c.require_api(base, token)
        slow_api, fast_api = h.Api(base, token), h.Api(base, token)
        todo, _ = queue.create(queue=QUEUE, title="slow worker, over HTTP")
        status, body = slow_api.post(
            "/api/v1/todos/claim/", {"queues": [QUEUE], "lease_seconds": lease, "worker": "slow"}
        )
        c.check(status == 200 and [t["id"] for t in body["todos"]] == [todo.id], "the slow worker claims it")
        slow_lease = body["todos"][0]["lease_id"]
        time.sleep(lease + 0.5)
        status, body = fast_api.post("/api/v1/todos/claim/", {"queues": [QUEUE], "lease_seconds": 30, "worker": "fast"})
        c.check(
            status == 200 and [t["id"] for t in body["todos"]] == [todo.id], "the fast worker claims it after the lapse"
        )
        fast_lease = body["todos"][0]["lease_id"]
        status, _ = fast_api.post(
            f"/api/v1/todos/{todo.id}/complete/", {"lease_id": fast_lease, "result": {"by": "fast"}}
        )
        c.check(status == 200, "the fast worker completes it")
        hb_status, _ = slow_api.post(f"/api/v1/todos/{todo.id}/heartbeat/", {"lease_id": slow_lease})
        late_status, late_body = slow_api.post(
            f"/api/v1/todos/{todo.id}/complete/", {"lease_id": slow_lease, "result": {"by": "slow"}}
        )
        todo.refresh_from_db()
        c.figure(
            f"over HTTP: slow heartbeat -> {hb_status}, slow complete -> {late_status} {late_body}; "
            f"todo {todo.state}, result {todo.result}"
        )
        c.check(hb_status == 409 and late_status == 409, "the slow worker's late heartbeat and complete get 409")
        c.check(
            isinstance(late_body, dict) and late_body.get("error", {}).get("code") == "conflict",
            "409 carries the error shape with code 'conflict'",
        )
        c.check(todo.state == "done" and todo.result == {"by": "fast"}, "the fast worker's result stands")
        Todo.objects.filter(pk=todo.pk).delete()


def drill(lease: float, http: bool) -> None:
    db = c.DrillDb("slow")
    _, token = db.agent()
    in_process(lease)
    if http:
        over_http(db, token, lease)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--in-process-only", action="store_true")
    args = parser.parse_args()
    c.run_drill("slow_worker", lambda: drill(args.lease, not args.in_process_only))


if __name__ == "__main__":
    main()
