"""/metrics: the queue's state read truthfully from the database, counters that move with known
traffic, access limits, and multiprocess mode under a real gunicorn with several workers."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta

import pytest
from django.db.models.functions import Now
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from switchboard import metrics
from switchboard.tests.conftest import ROOT, database_url
from todos import queue
from todos.management.commands.reap_leases import Command as Reaper


def scrape(client, **headers) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return parse(response.content.decode())


def parse(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_show_the_queue_and_the_transitions_after_a_known_workload(client, agent, make_todo):
    before = {
        "create": value("switchboard_todo_transitions_total", verb="create", outcome="ok"),
        "claim": value("switchboard_todo_transitions_total", verb="claim_next", outcome="ok"),
        "fail": value("switchboard_todo_transitions_total", verb="fail", outcome="dead_lettered"),
        "conflict": value("switchboard_todo_transitions_total", verb="complete", outcome="conflict"),
    }
    for _ in range(3):
        make_todo("metrics-q", max_attempts=1, created_at=Now() - timedelta(seconds=90))
    make_todo("metrics-q", delay_seconds=3600)
    [todo] = queue.claim_next(agent=agent, queues=["metrics-q"])
    queue.fail(todo.id, agent=agent, lease_id=todo.lease_id, error="boom")  # attempt 1 of 1: dead-letter
    with pytest.raises(Exception):  # noqa: B017 (a conflict: the receipt is spent)
        queue.complete(todo.id, agent=agent, lease_id=todo.lease_id)

    samples = scrape(client)

    def gauge(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert gauge("switchboard_database_up") == 1
    assert gauge("switchboard_todos", queue="metrics-q", state="pending") == 2
    assert gauge("switchboard_todos", queue="metrics-q", state="claimed") == 0
    assert gauge("switchboard_todos", queue="metrics-q", state="failed") == 1
    assert gauge("switchboard_todos", queue="metrics-q", state="scheduled") == 1
    assert gauge("switchboard_dead_letters", queue="metrics-q") == 1
    assert gauge("switchboard_retry_waiting", queue="metrics-q") == 0
    assert 85 <= gauge("switchboard_oldest_pending_age_seconds", queue="metrics-q") < 300
    key = ("switchboard_todo_transitions_total", "verb", "outcome")

    def counter(verb: str, outcome: str) -> float:
        return samples[(key[0], (("outcome", outcome), ("verb", verb)))]

    assert counter("create", "ok") - before["create"] == 4  # three pending, one scheduled
    assert counter("claim_next", "ok") - before["claim"] == 1
    assert counter("fail", "dead_lettered") - before["fail"] == 1
    assert counter("complete", "conflict") - before["conflict"] == 1


def test_an_empty_known_queue_reports_zero_instead_of_vanishing(client, agent, make_todo):
    todo = make_todo("metrics-empty")
    [claimed] = queue.claim_next(agent=agent, queues=["metrics-empty"])
    queue.complete(todo.id, agent=agent, lease_id=claimed.lease_id)
    samples = scrape(client)
    assert samples[("switchboard_todos", (("queue", "metrics-empty"), ("state", "pending")))] == 0
    assert samples[("switchboard_oldest_pending_age_seconds", (("queue", "metrics-empty"),))] == 0


def test_cancelled_todos_paused_queues_and_cancels_are_in_the_metrics(client, make_todo):
    from todos import controls

    before = value("switchboard_todo_transitions_total", verb="cancel", outcome="ok")
    todo = make_todo("metrics-cancel")
    make_todo("metrics-cancel")
    queue.cancel(todo.id, operator="ops")
    controls.pause("metrics-cancel")
    samples = scrape(client)
    assert samples[("switchboard_cancelled", (("queue", "metrics-cancel"),))] == 1
    assert samples[("switchboard_queue_paused", (("queue", "metrics-cancel"),))] == 1
    assert samples[("switchboard_todos", (("queue", "metrics-cancel"), ("state", "pending")))] == 1
    assert value("switchboard_todo_transitions_total", verb="cancel", outcome="ok") - before == 1


def test_lease_lapses_are_counted_by_the_reaper_and_by_claims(agent, make_todo):
    requeued = value("switchboard_lease_lapses_total", detected_by="reaper", outcome="requeued")
    dead = value("switchboard_lease_lapses_total", detected_by="reaper", outcome="dead_lettered")
    reclaimed = value("switchboard_lease_lapses_total", detected_by="claim", outcome="reclaimed")
    lapsed = {"state": "claimed", "attempt": 1, "owner": "alice", "lease_id": "ls_x"}
    make_todo("lapse-q", lease_expires_at=Now() - timedelta(seconds=5), **lapsed)
    make_todo("lapse-q", max_attempts=1, lease_expires_at=Now() - timedelta(seconds=5), **lapsed)
    queue.requeue_lapsed(batch=10)
    assert value("switchboard_lease_lapses_total", detected_by="reaper", outcome="requeued") - requeued == 1
    assert value("switchboard_lease_lapses_total", detected_by="reaper", outcome="dead_lettered") - dead == 1

    # Claims that take a lapsed lease before the reaper sweeps it: by the scan, and by id.
    a = make_todo("lapse-q2", lease_expires_at=Now() - timedelta(seconds=5), **lapsed)
    b = make_todo("lapse-q3", lease_expires_at=Now() - timedelta(seconds=5), **lapsed)
    make_todo("lapse-q2")  # a pending one claimed beside it does not count
    got = queue.claim_next(agent=agent, queues=["lapse-q2"], limit=5)
    assert {t.id for t in got} >= {a.id}
    queue.claim(b.id, agent=agent)
    assert value("switchboard_lease_lapses_total", detected_by="claim", outcome="reclaimed") - reclaimed == 2
    # The todo the reaper requeued is an ordinary pending todo to the next claim: not counted again.
    [again] = queue.claim_next(agent=agent, queues=["lapse-q"])
    assert again.errors[-1]["error"] == "lease expired"
    assert value("switchboard_lease_lapses_total", detected_by="claim", outcome="reclaimed") - reclaimed == 2


def test_reaper_sweeps_are_counted_and_timed(transactional_db):
    sweeps = value("switchboard_reaper_sweeps_total", outcome="ok")
    timed = value("switchboard_reaper_sweep_duration_seconds_count")
    Reaper().sweep(batch=10)
    assert value("switchboard_reaper_sweeps_total", outcome="ok") - sweeps == 1
    assert value("switchboard_reaper_sweep_duration_seconds_count") - timed == 1


def test_http_requests_are_labelled_by_route_pattern_not_path(client, db):
    before = value("switchboard_http_requests_total", method="GET", route="<unmatched>", status="404")
    latency = value("switchboard_http_request_duration_seconds_count", method="GET", route="healthz")
    client.get("/healthz")
    client.get("/no/such/path/td_123")
    client.get("/no/such/path/td_456")
    assert value("switchboard_http_requests_total", method="GET", route="<unmatched>", status="404") - before == 2
    assert value("switchboard_http_request_duration_seconds_count", method="GET", route="healthz") - latency == 1
    families = {f.name for f in REGISTRY.collect()}
    assert "switchboard_ingest_deliveries" in families


def test_ingest_deliveries_are_counted_by_source_and_outcome(client, db):
    before = value("switchboard_ingest_deliveries_total", source="github", outcome="rejected_signature")
    metrics.record_ingest_delivery("github", "rejected_signature")
    metrics.INGEST_DELIVERIES.labels(source="github", outcome="rejected_signature").inc()
    assert value("switchboard_ingest_deliveries_total", source="github", outcome="rejected_signature") - before == 2
    with pytest.raises(ValueError):
        metrics.record_ingest_delivery("github", "made-up")
    assert 'switchboard_ingest_deliveries_total{outcome="rejected_signature",source="github"}' in (
        client.get("/metrics").content.decode()
    )


def test_metrics_token_is_required_when_set(client, db, settings):
    settings.METRICS_TOKEN = "s3cret-metrics-token"
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-metrics-token").status_code == 200


def test_metrics_allowed_networks_refuse_other_addresses(client, db, settings):
    settings.METRICS_ALLOWED_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200


def test_gauges_are_cached_briefly(client, make_todo, django_assert_num_queries):
    make_todo("cache-q")
    scrape(client)
    make_todo("cache-q")
    with django_assert_num_queries(0):
        samples = scrape(client)  # within METRICS_CACHE_SECONDS: the cached answer
    assert samples[("switchboard_todos", (("queue", "cache-q"), ("state", "pending")))] == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    # Generous: with every worker recycling at once, a request waits for a new one to boot (seconds on a
    # loaded machine); this test counts requests, it does not time them.
    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 (a local test server)
        return response.status, response.read().decode()


@pytest.mark.slow
def test_counters_are_summed_across_gunicorn_workers(db, tmp_path):
    """Two gunicorn workers, each recycled after 8 requests (so 40 requests pass through at least five
    worker processes, most of them gone by the scrape): /metrics, answered by whichever worker, counts
    all 40."""
    port = _free_port()
    metrics_dir = str(tmp_path)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "switchboard.settings_test",
        "DATABASE_URL": database_url(),
        "GUNICORN_BIND": f"127.0.0.1:{port}",
        "GUNICORN_WORKERS": "2",
        "GUNICORN_THREADS": "2",
        "PROMETHEUS_MULTIPROC_DIR": metrics_dir,
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "switchboard.asgi:application",
            "-c",
            "gunicorn.conf.py",
            "--max-requests",
            "8",
            "--max-requests-jitter",
            "1",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(f"http://127.0.0.1:{port}/healthz")
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.2)
        for _ in range(39):  # plus the one above: 40
            assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
            # A uvicorn worker checks its request count every 0.1 s, then finishes and is replaced:
            # paced, the 40 requests pass through several generations of workers, as under gthread.
            time.sleep(0.25)
        files = [f for f in os.listdir(metrics_dir) if f.startswith("counter_")]
        totals = set()
        for _ in range(4):
            _status, body = _get(f"http://127.0.0.1:{port}/metrics")
            samples = parse(body)
            key = ("switchboard_http_requests_total", (("method", "GET"), ("route", "healthz"), ("status", "200")))
            totals.add(samples[key])
        assert totals == {40.0}
        assert len(files) >= 5, files  # one file per worker process that ever served
    finally:
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=30)
    assert server.returncode == 0, stderr.decode()[-2000:]
