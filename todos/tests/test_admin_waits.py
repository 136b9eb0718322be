"""The operator's side of waits (issue 20): the Waiting filter, what a todo waits for on its page, and
approve / reject with a note."""

from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

from todos import queue
from todos.models import Todo, TodoState
from todos.tests.test_admin import CHANGELIST, _messages, _post_action

pytestmark = pytest.mark.django_db


@pytest.fixture
def waiting(agent, make_todo) -> Todo:
    todo = queue.claim(make_todo("reviews", title="needs sign-off").id, agent=agent)
    waited, _ = queue.wait(todo.id, agent=agent, lease_id=todo.lease_id, wait_for={"token": True}, timeout_seconds=3600)
    return waited


def test_the_waiting_filter_lists_waiting_todos_only(admin_client, waiting, make_todo):
    make_todo("reviews", title="plain")
    body = admin_client.page(reverse(CHANGELIST) + "?state=waiting")
    assert "needs sign-off" in body and "plain" not in body


def test_the_detail_page_shows_what_it_waits_for_and_offers_approve_and_reject(admin_client, waiting):
    body = admin_client.page(reverse("admin:todos_todo_change", args=[quote(waiting.id)]))
    assert "Waits for" in body and "&quot;token&quot;" in body and "Times out" in body
    assert "Approve a wait" in body and "Reject a wait" in body


@pytest.mark.parametrize("verdict", ["approve", "reject"])
def test_an_operator_approves_or_rejects_with_a_note_handed_to_the_agent(admin_client, waiting, verdict, make_todo):
    other = make_todo("reviews")
    response = _post_action(admin_client, verdict, [waiting.id, other.id], confirm="yes", note="ship it")
    verb = "approved" if verdict == "approve" else "rejected"
    assert _messages(response) == [f"1 {verb}; 1 skipped: 1 pending (only waiting todos can be {verb})."]
    after = Todo.objects.get(pk=waiting.id)
    assert after.state == TodoState.PENDING
    assert after.resolution["by"] == "operator" and after.resolution["verdict"] == verb
    assert after.resolution["note"] == "ship it" and after.resolution["resolved_by"] == "admin"
