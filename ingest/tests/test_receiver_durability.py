"""Store-then-ack under stress: racing identical deliveries, and a database that fails mid-request."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
from django.db import connection

from events.models import Event
from ingest.tests.conftest import github_headers, pr_payload, to_body
from todos.models import Todo


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(  # noqa: S310 (the test's own live server, http://)
        url, data=body, method="POST", headers={**headers, "Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (the test's own live server)
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.django_db(transaction=True)
def test_receive_twenty_concurrent_identical_deliveries_make_one_event(live_server, make_source, make_route):
    source = make_source("gh", "github")
    make_route(source, "pull_request.*", "github.prs")
    make_route(source, "pull_request.opened", "triage")
    body = to_body(pr_payload())
    headers = github_headers(body, delivery="race-1")
    url = f"{live_server.url}/ingest/gh/"
    barrier = threading.Barrier(20)
    results: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def deliver() -> None:
        barrier.wait()
        outcome = _post(url, body, headers)
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=deliver) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    statuses = sorted(status for status, _ in results)
    assert statuses == [200] * 19 + [202]
    event = Event.objects.get()
    assert {data["event_id"] for _, data in results} == {event.id}
    assert [data["duplicate"] for status, data in results if status == 202] == [False]
    todos = Todo.objects.filter(event=event)
    assert todos.count() == 2
    # Every duplicate answer names the winner's todos: they were committed before it could see them.
    assert {tuple(sorted(data["todo_ids"])) for _, data in results} == {tuple(sorted(t.id for t in todos))}


@pytest.fixture
def failing_todo_insert(transactional_db):
    """A trigger that makes every todo INSERT fail in the database, after the event row went in."""

    def install(action: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"CREATE FUNCTION ingest_test_fail() RETURNS trigger AS $$ BEGIN {action} END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                "CREATE TRIGGER ingest_test_fail BEFORE INSERT ON todos_todo"
                " FOR EACH ROW EXECUTE FUNCTION ingest_test_fail()"
            )

    yield install
    connection.close()  # the connection may be the one the database killed
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER IF EXISTS ingest_test_fail ON todos_todo")
        cursor.execute("DROP FUNCTION IF EXISTS ingest_test_fail()")


def test_receive_when_the_todo_insert_fails_is_503_and_leaves_no_event(
    failing_todo_insert, make_source, make_route, post_webhook
):
    make_route(make_source("gh", "github"), "*", "github.prs")
    failing_todo_insert("RAISE EXCEPTION 'disk on fire';")
    body = to_body(pr_payload())
    response = post_webhook("gh", body, github_headers(body))
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "unavailable"
    assert response["Retry-After"] == "1"
    assert Event.objects.count() == 0
    assert Todo.objects.count() == 0


def test_receive_when_the_connection_dies_mid_transaction_is_503_and_leaves_no_event(
    failing_todo_insert, make_source, make_route, post_webhook
):
    make_route(make_source("gh", "github"), "*", "github.prs")
    # The server ends our session between the event INSERT and the todo INSERT: a crash, a failover.
    failing_todo_insert("PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW;")
    body = to_body(pr_payload())
    response = post_webhook("gh", body, github_headers(body, delivery="dies"))
    assert response.status_code == 503
    connection.close()
    assert Event.objects.count() == 0
    assert Todo.objects.count() == 0
    # The provider's retry, once the database is healthy, is stored as a first delivery.
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER ingest_test_fail ON todos_todo")
    response = post_webhook("gh", body, github_headers(body, delivery="dies"))
    assert response.status_code == 202
    assert Event.objects.get().delivery_id == "dies"
    assert Todo.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_receive_a_declared_huge_body_is_refused_before_it_is_sent(live_server, make_source):
    # The client announces 50 MB and sends a few bytes: the answer comes from the Content-Length alone,
    # without waiting for (or buffering) the body.
    import socket
    from urllib.parse import urlparse

    make_source("gh", "github")
    address = urlparse(live_server.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(
            b"POST /ingest/gh/ HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 50000000\r\n\r\n" + b"{" * 100
        )
        received = b""
        while b"too_large" not in received and (chunk := sock.recv(65536)):
            received += chunk
        response = received.decode("latin-1")
    assert response.startswith("HTTP/1.1 413")
    assert '"too_large"' in response
    assert Event.objects.count() == 0
