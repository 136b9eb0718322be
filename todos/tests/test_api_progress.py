"""Progress and checkpoints on the heartbeat (issue 21): fenced by the receipt, shown on the todo, and the
checkpoint handed to the next claimer after a lapse or a failure."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.db.models.functions import Now
from django.urls import reverse

from todos import queue
from todos.api.fields import MAX_CHECKPOINT_BYTES
from todos.models import Todo, TodoState

pytestmark = pytest.mark.django_db


@pytest.fixture
def claimed(api, make_todo):
    make_todo("jobs")
    [todo] = api.post("/todos/claim/", {"queues": ["jobs"]}).json()["todos"]
    return todo


def _beat(api, todo, **body):
    return api.post(f"/todos/{todo['id']}/heartbeat/", {"lease_id": todo["lease_id"], **body})


def test_a_heartbeat_with_progress_and_a_checkpoint_shows_both_on_the_todo(api, claimed):
    response = _beat(api, claimed, progress={"percent": 40, "message": "3 of 8 files"}, checkpoint={"done": 3})
    assert response.status_code == 200, response.json()
    assert response.json()["progress"] == {"percent": 40.0, "message": "3 of 8 files"}
    assert response.json()["checkpoint"] == {"done": 3}
    read = api.get(f"/todos/{claimed['id']}/").json()
    assert read["progress"] == {"percent": 40.0, "message": "3 of 8 files"} and read["checkpoint"] == {"done": 3}


def test_a_heartbeat_without_them_keeps_the_last_progress_and_checkpoint(api, claimed):
    _beat(api, claimed, progress={"percent": 10}, checkpoint={"page": 1})
    response = _beat(api, claimed)
    assert response.json()["progress"] == {"percent": 10.0} and response.json()["checkpoint"] == {"page": 1}


def test_progress_with_a_stale_receipt_is_409_and_changes_nothing(api, claimed):
    _beat(api, claimed, progress={"percent": 10}, checkpoint={"page": 1})
    before = Todo.objects.get(pk=claimed["id"])
    stale = {**claimed, "lease_id": "ls_" + "0" * 32}
    response = _beat(api, stale, progress={"percent": 99}, checkpoint={"page": 99})
    assert response.status_code == 409
    after = Todo.objects.get(pk=claimed["id"])
    unchanged = (before.progress, before.checkpoint, before.updated_at)
    assert (after.progress, after.checkpoint, after.updated_at) == unchanged


def test_the_previous_holders_receipt_cannot_write_progress_after_a_reclaim(api, make_agent, api_for, claimed):
    Todo.objects.filter(pk=claimed["id"]).update(lease_expires_at=Now() - timedelta(seconds=1))
    bob = api_for(make_agent("bob"))
    [again] = bob.post("/todos/claim/", {"queues": ["jobs"]}).json()["todos"]
    assert again["id"] == claimed["id"]
    assert _beat(api, claimed, checkpoint={"from": "the old holder"}).status_code == 409
    assert Todo.objects.get(pk=claimed["id"]).checkpoint is None


def test_the_checkpoint_is_handed_to_the_next_claimer_after_a_lapse(api, make_agent, api_for, claimed):
    _beat(api, claimed, progress={"percent": 50, "message": "half"}, checkpoint={"cursor": "abc", "done": [1, 2]})
    Todo.objects.filter(pk=claimed["id"]).update(lease_expires_at=Now() - timedelta(seconds=1))
    queue.reap_once(batch=100)
    assert Todo.objects.get(pk=claimed["id"]).state == TodoState.PENDING
    bob = api_for(make_agent("bob"))
    [retry] = bob.post("/todos/claim/", {"queues": ["jobs"]}).json()["todos"]
    assert retry["id"] == claimed["id"] and retry["attempt"] == 2
    assert retry["checkpoint"] == {"cursor": "abc", "done": [1, 2]}


def test_the_checkpoint_survives_a_failure_into_the_retry(api, claimed):
    _beat(api, claimed, checkpoint={"step": 4})
    api.post(f"/todos/{claimed['id']}/fail/", {"lease_id": claimed["lease_id"], "retry_in_seconds": 0})
    [retry] = api.post("/todos/claim/", {"queues": ["jobs"]}).json()["todos"]
    assert retry["attempt"] == 2 and retry["checkpoint"] == {"step": 4}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"progress": {"percent": 101}}, "progress"),
        ({"progress": {"percent": -1}}, "progress"),
        ({"progress": {"message": "x" * 501}}, "progress"),
        ({"progress": {"percent": 5, "eta": 3}}, "progress"),
        ({"progress": {}}, "progress"),
        ({"checkpoint": {"blob": "x" * MAX_CHECKPOINT_BYTES}}, "checkpoint"),
        ({"checkpoint": [1, 2]}, "checkpoint"),
    ],
)
def test_bad_progress_or_checkpoint_is_a_400_naming_the_field_and_changes_nothing(api, claimed, body, field):
    before = Todo.objects.get(pk=claimed["id"])
    response = _beat(api, claimed, **body)
    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"]
    after = Todo.objects.get(pk=claimed["id"])
    assert (after.lease_expires_at, after.progress, after.checkpoint) == (before.lease_expires_at, None, None)


def test_the_admin_todo_page_shows_progress_and_checkpoint(admin_client, api, claimed):
    _beat(api, claimed, progress={"percent": 30, "message": "indexing"}, checkpoint={"shard": 7})
    page = admin_client.page(reverse("admin:todos_todo_change", args=[quote(claimed["id"])]))
    assert "indexing" in page and "shard" in page
