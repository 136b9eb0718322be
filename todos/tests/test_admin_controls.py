"""The admin's controls: the cancel action on todos (the selection and every matching todo), the queue
page (counts, paused, limits, pause/resume actions, editing limits), and the dashboard showing them."""

from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

from todos import controls, queue
from todos.models import Queue, Todo, TodoState

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:todos_todo_changelist"
QUEUES = "admin:todos_queue_changelist"


def _messages(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_cancel_action_cancels_the_selection_and_records_the_operator(admin_client, make_todo, agent):
    pending = make_todo("jobs")
    claimed_todo = make_todo("jobs")
    done = make_todo("jobs", state=TodoState.DONE)
    queue.claim(claimed_todo.id, agent=agent)
    data = {
        "action": "cancel",
        "_selected_action": [pending.id, claimed_todo.id, done.id],
        "index": 0,
        "select_across": 0,
        "confirm": "1",
        "note": "wrong repo",
    }
    response = admin_client.post(reverse(CHANGELIST), data, follow=True)
    assert _messages(response) == [
        "2 cancelled; 1 skipped: 1 done"
        " (only pending, scheduled, waiting, retry-waiting and claimed todos can be cancelled)."
    ]
    for todo in (pending, claimed_todo):
        todo.refresh_from_db()
        assert todo.state == TodoState.CANCELLED
        assert todo.errors[-1]["cancelled_by"] == "admin" and todo.errors[-1]["reason"] == "wrong repo"
    assert Todo.objects.get(pk=done.pk).state == TodoState.DONE


def test_cancel_every_matching_todo_in_batches(admin_client, make_todo):
    for _ in range(5):
        make_todo("jobs")
    other = make_todo("other")
    url = reverse("admin:todos_todo_bulk", args=["cancel"]) + "?queue=jobs"
    response = admin_client.post(url, {"note": "bad deploy"}, follow=True)
    assert _messages(response) == ["Every matching todo: 5 cancelled."]
    assert Todo.objects.filter(queue="jobs", state=TodoState.CANCELLED).count() == 5
    assert Todo.objects.get(pk=other.pk).state == TodoState.PENDING


def test_the_detail_page_offers_cancel_for_a_claimed_todo(admin_client, make_todo):
    todo = make_todo("jobs", state=TodoState.CLAIMED)
    body = admin_client.page(reverse("admin:todos_todo_change", args=[quote(todo.id)]))
    assert "Cancel (stop it for good" in body


def test_the_queue_page_lists_every_queue_with_counts_paused_and_limits(admin_client, make_todo):
    make_todo("jobs")
    make_todo("jobs")
    make_todo("idle", state=TodoState.DONE)
    controls.pause("jobs")
    controls.set_limits("jobs", max_claimed=3, rate_per_second=20, rate_burst=5)
    response = admin_client.get(reverse(QUEUES))
    assert response.status_code == 200
    body = response.content.decode()
    assert "jobs" in body and "idle" in body
    assert "max 3 claimed · 20/s burst 5" in body
    assert 'sb-state-paused">paused' in body
    row = body[body.index(">jobs<") :]
    assert '<td class="field-value">2</td>' in row or ">2<" in row


def test_pause_and_resume_actions_on_the_queue_page(admin_client, make_todo):
    make_todo("jobs")
    changelist = reverse(QUEUES)
    base = {"_selected_action": ["jobs"], "index": 0, "select_across": 0}
    response = admin_client.post(changelist, {**base, "action": "pause_queues"}, follow=True)
    assert _messages(response) == ["1 queue(s) paused; creates still land."]
    assert Queue.objects.get(name="jobs").paused
    admin_client.post(changelist, {**base, "action": "resume_queues"}, follow=True)
    assert not Queue.objects.get(name="jobs").paused


def test_editing_limits_on_the_queue_page_goes_through_the_controls(admin_client, make_todo):
    make_todo("jobs")
    url = reverse("admin:todos_queue_change", args=["jobs"])
    assert admin_client.get(url).status_code == 200
    response = admin_client.post(url, {"max_claimed": "2", "rate_per_second": "4", "rate_burst": ""})
    assert response.status_code == 302, response.content
    row = Queue.objects.get(name="jobs")
    assert (row.max_claimed, row.rate_per_second, row.rate_burst, row.tokens) == (2, 4.0, 4, 4.0)


@pytest.mark.parametrize(
    "form,field",
    [
        ({"max_claimed": "-1", "rate_per_second": "", "rate_burst": ""}, "max_claimed"),
        ({"max_claimed": "", "rate_per_second": "0", "rate_burst": ""}, "rate_per_second"),
        ({"max_claimed": "", "rate_per_second": "", "rate_burst": "5"}, "rate_burst"),
    ],
)
def test_a_bad_limit_on_the_queue_page_is_an_error_on_its_field(admin_client, make_todo, form, field):
    make_todo("jobs")
    response = admin_client.post(reverse("admin:todos_queue_change", args=["jobs"]), form)
    assert response.status_code == 200
    assert field in response.context["adminform"].form.errors
    row = Queue.objects.get(name="jobs")
    assert (row.max_claimed, row.rate_per_second, row.rate_burst) == (None, None, None)


def test_the_dashboard_shows_paused_queues_and_cancelled_counts(admin_client, make_todo):
    cancelled = make_todo("jobs")
    make_todo("jobs")
    queue.cancel(cancelled.id, operator="ops")
    controls.pause("jobs")
    body = admin_client.page(reverse("admin-dashboard"))
    assert 'sb-state-paused">paused' in body
    data = admin_client.ok(reverse("admin-dashboard-json")).json()
    [row] = data["queues"]
    assert (row["paused"], row["cancelled"], row["pending"]) == (True, 1, 1)
