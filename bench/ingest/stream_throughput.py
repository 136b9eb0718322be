"""Redis Stream entries per second into event + todo (manage.py consume_stream's store-then-ack loop), by
batch size.

For each batch size, a fresh stream is filled with --entries entries first (the producer is not what is
measured), then one consumer (ingest.streams.StreamConsumer, the command's own loop step, in this
process) reads, stores and acks until the stream is drained. Each entry has its own delivery id and
one route matches it: one event and one todo committed per entry before its XACK.

    .venv/bin/python bench/ingest/stream_throughput.py                         # batch 1,10,100; 3 runs each
    .venv/bin/python bench/ingest/stream_throughput.py --batches 10 --runs 1 --entries 2000

Redis is a private redis-server (from PATH) on a free port in a temporary directory, append-only with
fsync every second (Redis's default durability for an AOF). PostgreSQL is the embedded server's
database ``switchboard_bench_stream`` (recreated), or DATABASE_URL's server. Never point it at real data.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.harness import free_port, machine_summary, median, scratch_django

STREAM, GROUP, SLUG = "bench-orders", "bench", "bench-stream"


def start_redis(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    import redis

    port = free_port()
    server = shutil.which("redis-server")
    if server is None:
        sys.exit("redis-server is not on PATH (apt-get install redis-server)")
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", "",
         "--appendonly", "yes", "--appendfsync", "everysec", "--logfile", str(directory / "redis.log")],
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 20
    while True:
        try:
            redis.Redis.from_url(url).ping()
            return proc, url
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                sys.exit("redis-server did not start")
            time.sleep(0.05)


def payload(n: int, size: int) -> str:
    body = {"id": n, "customer": {"id": 4711, "email": "someone@example.com"}, "lines": [{"sku": "A-1", "qty": 2}]}
    text = json.dumps(body)
    body["note"] = "x" * max(0, size - len(text) - 12)
    return json.dumps(body)


def fill(client: Any, entries: int, size: int) -> None:
    client.delete(STREAM, f"{STREAM}:rejected")
    pipe = client.pipeline(transaction=False)
    for n in range(entries):
        pipe.xadd(STREAM, {"type": "order.created", "delivery_id": f"ord-{n}", "payload": payload(n, size)})
        if n % 1000 == 999:
            pipe.execute()
    pipe.execute()


def run(url: str, batch: int, entries: int, size: int) -> float:
    """Entries per second for one drain of a freshly filled stream."""
    import redis
    from django.db import connection

    from ingest.streams import StreamConsumer

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE todos_todo, events_event CASCADE")
        cursor.execute("VACUUM ANALYZE todos_todo")
        cursor.execute("VACUUM ANALYZE events_event")
    client = redis.Redis.from_url(url)
    fill(client, entries, size)
    consumer = StreamConsumer(
        client,
        stream=STREAM,
        group=GROUP,
        consumer="bench",
        source=SLUG,
        batch=batch,
        block_ms=100,
        claim_idle_ms=60000,
        rejected_stream=f"{STREAM}:rejected",
        rejected_maxlen=1000,
        max_bytes=1024 * 1024,
    )
    consumer.ensure_group()
    done = 0
    started = time.perf_counter()
    while done < entries:
        result = consumer.run_once()
        assert result is not None
        done += result.stored
        if not result.read:
            raise SystemExit(f"stream drained after {done} of {entries} entries stored")
    elapsed = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("SELECT (SELECT count(*) FROM events_event), (SELECT count(*) FROM todos_todo)")
        events, todos = cursor.fetchone()  # type: ignore[misc]
    pending = int(client.xpending(STREAM, GROUP)["pending"])
    if (events, todos, pending) != (entries, entries, 0):
        raise SystemExit(f"MISMATCH: {events} events, {todos} todos, {pending} pending for {entries} entries")
    client.close()
    return entries / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,10,100", help="comma-separated --batch sizes")
    parser.add_argument("--entries", type=int, default=3000, help="entries per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per batch size (the median is reported)")
    parser.add_argument("--payload-bytes", type=int, default=1000, help="approximate payload size")
    args = parser.parse_args()

    server, _ = scratch_django("stream", LOG_LEVEL="WARNING")
    from ingest.models import Route, Source

    source = Source.objects.create(slug=SLUG, provider="stream")
    Route.objects.create(source=source, event_pattern="order.*", queue="bench.orders", title_template="Order {id}")

    with tempfile.TemporaryDirectory() as tmp:
        redis_proc, url = start_redis(Path(tmp))
        try:
            print(machine_summary(server))
            print(f"{args.entries} entries per run, payload ~{args.payload_bytes} bytes, 1 route (event + todo each)")
            print(f"{'batch':>6} {'entries/s':>10}  runs")
            for batch in [int(b) for b in args.batches.split(",")]:
                rates = [run(url, batch, args.entries, args.payload_bytes) for _ in range(args.runs)]
                print(f"{batch:>6} {median(rates):>10.0f}  {', '.join(f'{r:.0f}' for r in rates)}", flush=True)
        finally:
            redis_proc.terminate()
            redis_proc.wait(20)


if __name__ == "__main__":
    main()
