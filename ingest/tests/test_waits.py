"""A verified delivery resolves the waits it matches, in the transaction that stores it (issue 20): once,
however often it is delivered, with the event attached; a delivery that does not match leaves them."""

from __future__ import annotations

import threading

import pytest

from events.models import Event
from ingest import intake
from ingest.tests.conftest import github_headers, to_body
from ingest.tests.test_receiver_durability import _post
from todos import queue
from todos.models import Todo, TodoState, Waitpoint

CHECK = {"event": {"source": "gh", "type": "check_suite.*", "match": {"check_suite.head_sha": "4f2a"}}}


def _check_suite(sha: str = "4f2a", conclusion: str = "success") -> dict:
    return {
        "action": "completed",
        "check_suite": {"head_sha": sha, "conclusion": conclusion},
        "repository": {"full_name": "octo/hello"},
    }


@pytest.fixture(autouse=True)
def _gh_routed_to_reviews(make_source, make_route):
    # An agent waits only on events of a source routed into its scopes (issue 28); an inactive route grants
    # that without making todos of the deliveries.
    make_route(make_source("gh", "github"), "*", "reviews", is_active=False)


def _waiting(agent, make_todo, wait_for=CHECK) -> Todo:
    todo = queue.claim(make_todo("reviews").id, agent=agent)
    waited, _ = queue.wait(todo.id, agent=agent, lease_id=todo.lease_id, wait_for=wait_for, timeout_seconds=3600)
    return waited


@pytest.mark.django_db
def test_a_matching_delivery_resolves_the_wait_with_the_event(agent, make_todo, post_webhook):
    todo = _waiting(agent, make_todo)
    other = _waiting(agent, make_todo, {"event": {**CHECK["event"], "match": {"check_suite.head_sha": "ffff"}}})
    body = to_body(_check_suite())
    response = post_webhook("gh", body, github_headers(body, event="check_suite"))
    assert response.status_code == 202
    after = Todo.objects.get(pk=todo.id)
    assert after.state == TodoState.PENDING
    event = Event.objects.get()
    assert after.resolution["event"]["id"] == event.id
    assert after.resolution["event"]["payload"]["check_suite"]["conclusion"] == "success"
    assert Todo.objects.get(pk=other.id).state == TodoState.WAITING


@pytest.mark.django_db
@pytest.mark.parametrize(
    "match",
    [
        {"check_suite.head_sha": "4f2a", "check_suite.conclusion": "failure"},  # one path differs
        {"check_suite.head_sha": "4f2a", "repository.full_name": "octo/other"},
    ],
)
def test_every_path_of_the_match_must_hold(agent, make_todo, match):
    todo = _waiting(agent, make_todo, {"event": {"source": "gh", "type": "check_suite.*", "match": match}})
    intake.store_and_route(
        source="gh",
        event_type="check_suite.completed",
        delivery_id="d-1",
        payload=_check_suite(),
        headers={},
        routes=[],
    )
    assert Todo.objects.get(pk=todo.id).state == TodoState.WAITING


@pytest.mark.django_db
def test_the_type_glob_and_the_source_must_match(agent, make_todo):
    todo = _waiting(agent, make_todo)
    for source, event_type in (("gh", "check_run.completed"), ("other", "check_suite.completed")):
        intake.store_and_route(
            source=source,
            event_type=event_type,
            delivery_id=f"d-{source}",
            payload=_check_suite(),
            headers={},
            routes=[],
        )
    assert Todo.objects.get(pk=todo.id).state == TodoState.WAITING


@pytest.mark.django_db
def test_an_empty_match_takes_the_first_event_of_the_type(agent, make_todo):
    todo = _waiting(agent, make_todo, {"event": {"source": "gh", "type": "check_suite.completed"}})
    intake.store_and_route(
        source="gh",
        event_type="check_suite.completed",
        delivery_id="d-1",
        payload=_check_suite(),
        headers={},
        routes=[],
    )
    assert Todo.objects.get(pk=todo.id).state == TodoState.PENDING


@pytest.mark.django_db(transaction=True)
def test_the_same_github_delivery_sent_20_times_at_once_resolves_one_wait_and_stores_one_event(
    live_server, agent, make_todo
):
    todo = _waiting(agent, make_todo)
    body = to_body(_check_suite())
    headers = github_headers(body, event="check_suite", delivery="race-1")
    barrier = threading.Barrier(20)
    statuses: list[int] = []
    lock = threading.Lock()

    def deliver() -> None:
        barrier.wait()
        status, _ = _post(f"{live_server.url}/ingest/gh/", body, headers)
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=deliver) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(statuses) == [200] * 19 + [202]
    event = Event.objects.get()
    after = Todo.objects.get(pk=todo.id)
    assert after.state == TodoState.PENDING and after.resolution["event"]["id"] == event.id
    assert [e["error"] for e in after.errors].count("wait resolved") == 1
    assert Waitpoint.objects.get(todo_id=todo.id).resolved_at is not None
