"""One trace from a delivery to done (issue 21): the traceparent kept on the todo and handed to claimers,
and the spans the transitions emit when OpenTelemetry is on (the SDK's in-memory exporter)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ingest.models import Route, Source
from ingest.tests.conftest import GITHUB_SECRET, github_headers, pr_payload, to_body
from todos import queue, tracing
from todos.models import Todo

pytestmark = pytest.mark.django_db

SENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture(scope="session")
def _exporter() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    tracing.configure(exporter=exporter)
    tracing.disable()
    return exporter


@pytest.fixture
def spans(_exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    _exporter.clear()
    monkeypatch.setattr(tracing, "ENABLED", True)
    yield _exporter
    _exporter.clear()


def _by_name(exporter: InMemorySpanExporter) -> dict[str, list[object]]:
    out: dict[str, list[object]] = {}
    for span in exporter.get_finished_spans():
        out.setdefault(span.name.removeprefix("switchboard."), []).append(span)
    return out


@pytest.fixture
def github(db: None) -> Source:
    source = Source.objects.create(slug="gh", provider="github", secret=GITHUB_SECRET)
    Route.objects.create(source=source, event_pattern="pull_request.*", queue="github.prs", kind="review")
    return source


def test_one_trace_id_runs_from_a_signed_github_delivery_to_the_workers_complete(client, github, api, spans):
    body = to_body(pr_payload())
    delivered = client.post("/ingest/gh/", data=body, content_type="application/json", headers=github_headers(body))
    assert delivered.status_code == 202, delivered.json()
    [todo] = api.post("/todos/claim/", {"queues": ["github.prs"]}).json()["todos"]
    assert tracing.parse(todo["traceparent"]) is not None  # the worker continues the trace from here
    api.post(f"/todos/{todo['id']}/heartbeat/", {"lease_id": todo["lease_id"], "progress": {"percent": 50}})
    done = api.post(f"/todos/{todo['id']}/complete/", {"lease_id": todo["lease_id"], "result": {"ok": True}})
    assert done.status_code == 200

    named = _by_name(spans)
    [deliver], [create], [claim], [beat], [complete] = (
        named[n] for n in ("deliver", "create", "claim", "heartbeat", "complete")
    )
    trace_ids = {s.context.trace_id for s in (deliver, create, claim, beat, complete)}
    assert trace_ids == {tracing.parse(todo["traceparent"]).trace_id}
    assert deliver.parent is None
    assert create.parent.span_id == deliver.context.span_id
    assert claim.parent.span_id == deliver.context.span_id
    assert beat.parent.span_id == claim.context.span_id and complete.parent.span_id == claim.context.span_id
    assert claim.attributes["switchboard.todo.id"] == todo["id"]


def test_a_delivery_with_the_senders_traceparent_joins_the_senders_trace(client, github, spans):
    body = to_body(pr_payload())
    headers = {**github_headers(body), "traceparent": SENT}
    client.post("/ingest/gh/", data=body, content_type="application/json", headers=headers)
    [deliver] = _by_name(spans)["deliver"]
    assert deliver.context.trace_id == tracing.parse(SENT).trace_id
    assert deliver.parent.span_id == tracing.parse(SENT).span_id


def test_a_retry_is_a_new_span_linked_to_the_earlier_attempt_not_its_child(api, spans):
    made = api.post("/todos/", {"queue": "jobs", "traceparent": SENT}).json()
    [first] = api.post("/todos/claim/", {"queues": ["jobs"]}).json()["todos"]
    api.post(f"/todos/{first['id']}/fail/", {"lease_id": first["lease_id"], "retry_in_seconds": 0})
    [second] = api.post("/todos/claim/", {"queues": ["jobs"]}).json()["todos"]
    assert second["id"] == made["id"] and second["attempt"] == 2

    named = _by_name(spans)
    attempt1, attempt2 = sorted(named["claim"], key=lambda s: s.attributes["switchboard.todo.attempt"])
    [fail] = named["fail"]
    assert fail.parent.span_id == attempt1.context.span_id
    root = tracing.parse(SENT)
    assert attempt1.parent.span_id == root.span_id and attempt2.parent.span_id == root.span_id
    assert attempt2.context.span_id != attempt1.context.span_id
    assert [link.context.span_id for link in attempt2.links] == [attempt1.context.span_id]
    assert {s.context.trace_id for s in (attempt1, attempt2, fail)} == {root.trace_id}


def test_release_and_cancel_emit_spans_in_the_todos_trace(api, agent, spans):
    made = api.post("/todos/", {"queue": "jobs", "traceparent": SENT}).json()
    [claimed] = api.post("/todos/claim/", {"queues": ["jobs"]}).json()["todos"]
    api.post(f"/todos/{claimed['id']}/release/", {"lease_id": claimed["lease_id"]})
    api.post(f"/todos/{made['id']}/cancel/", {"reason": "not needed"})
    named = _by_name(spans)
    [claim], [release], [cancel] = named["claim"], named["release"], named["cancel"]
    assert release.parent.span_id == claim.context.span_id
    assert cancel.parent.span_id == tracing.parse(SENT).span_id


def test_a_traceparent_sent_on_create_is_kept_and_claims_answer_with_it(api):
    made = api.post("/todos/", {"queue": "jobs", "traceparent": SENT})
    assert made.status_code == 201 and made.json()["traceparent"] == SENT
    [claimed] = api.post("/todos/claim/", {"queues": ["jobs"]}).json()["todos"]
    assert claimed["traceparent"] == SENT


def test_a_traceparent_header_on_create_is_kept_when_the_body_names_none(api):
    made = api.post("/todos/", {"queue": "jobs"}, headers={"traceparent": SENT})
    assert made.json()["traceparent"] == SENT
    ignored = api.post("/todos/", {"queue": "jobs"}, headers={"traceparent": "garbage"})
    assert ignored.status_code == 201 and ignored.json()["traceparent"] is None


def test_with_tracing_off_a_delivery_still_starts_a_trace_and_nothing_is_emitted(client, github, _exporter):
    _exporter.clear()
    assert not tracing.ENABLED
    body = to_body(pr_payload())
    client.post("/ingest/gh/", data=body, content_type="application/json", headers=github_headers(body))
    todo = Todo.objects.get(queue="github.prs")
    assert tracing.parse(todo.traceparent) is not None
    assert _exporter.get_finished_spans() == ()


@pytest.mark.parametrize("bad", ["00-" + "0" * 32 + "-b7ad6b7169203331-01", "01-abc", SENT.upper(), 7])
def test_a_malformed_traceparent_on_create_is_a_400_naming_it_and_creates_nothing(api, bad):
    response = api.post("/todos/", {"queue": "jobs", "traceparent": bad})
    assert response.status_code == 400
    assert "traceparent" in response.json()["error"]["fields"]
    assert not Todo.objects.exists()


def test_a_create_with_no_traceparent_starts_a_trace_when_tracing_is_on(agent, spans):
    todo, _ = queue.create(queue="jobs", agent=agent)
    [create] = _by_name(spans)["create"]
    assert tracing.parse(todo.traceparent).span_id == create.context.span_id


def test_wait_and_resolve_emit_spans_in_the_todos_trace(api, agent, spans):
    made = api.post("/todos/", {"queue": "jobs", "traceparent": SENT}).json()
    claimed = queue.claim(made["id"], agent=agent)
    queue.wait(claimed.id, agent=agent, lease_id=claimed.lease_id, wait_for={"token": True}, timeout_seconds=60)
    queue.resolve(claimed.id, by="staff:ops", data={"ok": True})  # an operator
    named = _by_name(spans)
    [claim], [wait], [resolve] = named["claim"], named["wait"], named["resolve"]
    assert wait.parent.span_id == claim.context.span_id
    assert resolve.parent.span_id == tracing.parse(SENT).span_id
    assert {s.context.trace_id for s in (claim, wait, resolve)} == {tracing.parse(SENT).trace_id}
