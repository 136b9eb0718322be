"""Duplicate storm drill: 1,000 deliveries of 50 distinct GitHub webhooks (each sent 20 times,
shuffled, 32 at a time) make exactly 50 events and 50 todos.

    python -m bench.drills.duplicate_storm [--distinct 50] [--copies 20] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import random
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from bench import harness as h
from bench.drills import common as c

SLUG = "drill-github"
QUEUE = "drill-storm"


def require_ingest() -> tuple[type, type]:
    from django.apps import apps
    from django.urls import Resolver404, resolve

    try:
        resolve(f"/ingest/{SLUG}/")
        return apps.get_model("ingest", "Source"), apps.get_model("ingest", "Route")
    except (Resolver404, LookupError):
        c.skip("ingestion is not here yet (no /ingest/<slug>/ view or ingest.Source/Route models)")


def delivery(secret: str, n: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"action": "opened", "number": n, "pull_request": {"title": f"storm {n}"}}).encode()
    return body, {
        "X-GitHub-Event": "pull_request",
        "X-GitHub-Delivery": str(uuid.UUID(int=n + 1)),
        "X-Hub-Signature-256": "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest(),
    }


def drill(distinct: int, copies: int, concurrency: int) -> None:
    db = c.DrillDb("storm")
    source_model, route_model = require_ingest()
    from events.models import Event
    from todos.models import Todo

    secret = "drill-" + uuid.uuid4().hex
    names = {f.name for f in source_model._meta.get_fields()}
    secret_field = {"secret": secret} if "secret" in names else {"secrets": [secret]}
    source = source_model.objects.create(slug=SLUG, provider="github", **secret_field)
    route_model.objects.create(
        source=source, event_pattern="pull_request*", queue=QUEUE, kind="review", title_template="PR storm"
    )
    sends = [n for n in range(distinct) for _ in range(copies)]
    random.shuffle(sends)
    local = threading.local()
    with db.gunicorn() as base:

        def send(n: int) -> int:
            if not hasattr(local, "api"):
                local.api = h.Api(base)
            body, headers = delivery(secret, n)
            return local.api.post(f"/ingest/{SLUG}/", raw=body, headers=headers)[0]

        started = time.monotonic()
        with ThreadPoolExecutor(concurrency) as pool:
            codes = Counter(pool.map(send, sends))
        took = time.monotonic() - started
    events = Event.objects.filter(source=SLUG)
    todos = Todo.objects.filter(queue=QUEUE)
    keys = Counter(todos.values_list("idempotency_key", flat=True))
    c.figure(
        f"{len(sends)} deliveries ({distinct} distinct x {copies}) in {took:.1f} s "
        f"({len(sends) / took:.0f}/s, {concurrency} at a time); answers {dict(codes)}"
    )
    c.figure(f"events stored: {events.count()}; todos made: {todos.count()}")
    c.check(all(200 <= code < 300 for code in codes), "every delivery, first or duplicate, was acknowledged 2xx")
    c.check(events.count() == distinct, f"exactly {distinct} events")
    c.check(events.values("delivery_id").distinct().count() == distinct, "one event per delivery id")
    c.check(todos.count() == distinct, f"exactly {distinct} todos")
    c.check(all(n == 1 for n in keys.values()), "no idempotency key twice")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--distinct", type=int, default=50)
    parser.add_argument("--copies", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    c.run_drill("duplicate_storm", lambda: drill(args.distinct, args.copies, args.concurrency))


if __name__ == "__main__":
    main()
