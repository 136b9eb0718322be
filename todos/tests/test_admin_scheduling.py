"""The todo admin's scheduling actions (run now, change priority), its scheduled filter and column."""

from __future__ import annotations

from django.contrib.admin.utils import quote
from django.urls import reverse

from todos.models import Todo, TodoState

CHANGELIST = "admin:todos_todo_changelist"


def _post_action(client, action, ids, **extra):
    data = {"action": action, "_selected_action": ids, "index": 0, "select_across": 0, **extra}
    return client.post(reverse(CHANGELIST), data, follow=True)


def _messages(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_the_scheduled_filter_lists_scheduled_todos_with_their_run_time(admin_client, make_todo):
    scheduled = make_todo("q", delay_seconds=7200)
    pending = make_todo("q")
    page = admin_client.page(reverse(CHANGELIST), {"state": "scheduled"})
    assert scheduled.id in page and pending.id not in page
    assert "runs in 1" in page  # "runs in 1 hour, 59 minutes"


def test_run_now_makes_scheduled_todos_pending_and_skips_the_rest(admin_client, make_todo):
    scheduled, pending = make_todo("q", delay_seconds=3600), make_todo("q")
    response = _post_action(admin_client, "run_now", [scheduled.id, pending.id])
    assert _messages(response) == ["1 made claimable now; 1 skipped: 1 pending (only scheduled todos can be run now)."]
    scheduled.refresh_from_db()
    assert scheduled.state == TodoState.PENDING and scheduled.errors[-1]["operator"] == "admin"


def test_change_priority_asks_for_the_value_then_sets_it_on_pending_and_scheduled(admin_client, agent, make_todo):
    from todos import queue

    pending, scheduled = make_todo("q"), make_todo("q", delay_seconds=60)
    third = make_todo("q")
    response = _post_action(admin_client, "set_priority", [pending.id])
    assert b"New priority" in response.content
    claimed = queue.claim(third.id, agent=agent)
    ids = [pending.id, scheduled.id, claimed.id]
    response = _post_action(admin_client, "set_priority", ids, confirm="yes", note="-30")
    assert _messages(response)[0].startswith("2 given the new priority; 1 skipped: 1 claimed")
    assert dict(Todo.objects.filter(pk__in=ids).values_list("id", "priority")) == {
        pending.id: -30,
        scheduled.id: -30,
        claimed.id: 0,
    }


def test_change_priority_with_a_bad_value_changes_nothing_and_says_why(admin_client, make_todo):
    todo = make_todo("q")
    for note in ("urgent", "1000"):
        response = _post_action(admin_client, "set_priority", [todo.id], confirm="yes", note=note)
        assert "refused" in _messages(response)[0] and "priority" in _messages(response)[0]
    assert Todo.objects.get(pk=todo.pk).priority == 0


def test_the_detail_page_of_a_scheduled_todo_offers_run_now(admin_client, make_todo):
    todo = make_todo("q", delay_seconds=60)
    response = admin_client.get(reverse("admin:todos_todo_change", args=[quote(todo.id)]))
    assert response.status_code == 200, (response.status_code, response.headers.get("Location"))
    page = response.content.decode()
    assert "Run now" in page and "Change priority" in page
