"""The operator's triage view: the last error in the list, dead-letters grouped by it with one action
per group (through the batched every-matching run), and the console's branding."""

from __future__ import annotations

import html

import pytest
from django.urls import reverse

from todos.models import Todo, TodoState

CHANGELIST = "admin:todos_todo_changelist"


def _dead(make_todo, error: str, queue_name: str = "github", **extra):
    return make_todo(
        queue_name,
        state=TodoState.FAILED,
        attempt=5,
        next_retry_at=None,
        errors=[{"attempt": 4, "error": "earlier"}, {"attempt": 5, "at": "2026-01-01T00:00:00Z", "error": error}],
        **extra,
    )


@pytest.fixture
def graveyard(make_todo):
    return {
        "timeout": [_dead(make_todo, "timeout") for _ in range(3)],
        "keyerror": [_dead(make_todo, "KeyError 'pr'") for _ in range(2)],
        "other_queue": [_dead(make_todo, "timeout", "stripe")],
    }


def test_list_shows_each_todos_last_error_shortened(admin_client, make_todo):
    long = "ValueError: " + "x" * 200
    todo = _dead(make_todo, long)
    body = admin_client.page(reverse(CHANGELIST))
    assert 'class="field-last_error"' in body
    assert html.escape(long[:23]) + "…" in body  # cut in the cell, whole in the tooltip (to 120 characters)
    assert f'title="{html.escape(long[:120])}"' in body
    assert todo.id[:11] in body


def test_dead_letters_are_grouped_by_last_error_largest_first(admin_client, graveyard):
    response = admin_client.ok(reverse(CHANGELIST), {"dead": "yes"})
    groups = response.context["error_groups"]
    assert [(g["count"], g["error"]) for g in groups] == [(4, "timeout"), (2, "KeyError 'pr'")]
    body = response.content.decode()
    assert "4 \u00d7" in body and "KeyError &#x27;pr&#x27;" in body


def test_groups_follow_the_other_filters(admin_client, graveyard):
    response = admin_client.ok(reverse(CHANGELIST), {"dead": "yes", "queue": "github"})
    assert [(g["count"], g["error"]) for g in response.context["error_groups"]] == [
        (3, "timeout"),
        (2, "KeyError 'pr'"),
    ]


def test_groups_are_shown_only_on_the_dead_letter_list(admin_client, graveyard):
    assert "error_groups" not in admin_client.ok(reverse(CHANGELIST)).context
    assert "error_groups" not in admin_client.ok(reverse(CHANGELIST), {"state": "failed"}).context


def test_a_groups_link_lists_exactly_that_group(admin_client, graveyard):
    [timeout, _] = admin_client.ok(reverse(CHANGELIST), {"dead": "yes", "queue": "github"}).context["error_groups"]
    body = admin_client.page(timeout["list_url"])
    for todo in graveyard["timeout"]:
        assert todo.id[:11] in body
    for todo in graveyard["keyerror"] + graveyard["other_queue"]:
        assert todo.id[:11] not in body


def test_one_action_retries_a_whole_group_and_nothing_else(admin_client, graveyard):
    groups = admin_client.ok(reverse(CHANGELIST), {"dead": "yes", "queue": "github"}).context["error_groups"]
    [(_label, url)] = [a for a in groups[0]["actions"] if "once" in a[0].lower()]
    confirm = admin_client.get(url)
    assert confirm.status_code == 200 and b"last error: <strong>timeout</strong>" in confirm.content
    done = admin_client.post(url, {"note": "upstream fixed"}, follow=True)
    assert done.status_code == 200
    for todo in graveyard["timeout"]:
        todo.refresh_from_db()
        assert todo.state == TodoState.PENDING
        assert todo.errors[-1]["error"] == "operator retry" and todo.errors[-1]["note"] == "upstream fixed"
    assert Todo.objects.dead_lettered().count() == 3  # the KeyErrors and the other queue's timeout


def test_discard_acts_on_a_whole_group(admin_client, graveyard):
    groups = admin_client.ok(reverse(CHANGELIST), {"dead": "yes"}).context["error_groups"]
    [(_label, url)] = [a for a in groups[1]["actions"] if "discard" in a[0].lower()]
    admin_client.post(url, {"note": "bad payloads"}, follow=True)
    assert set(Todo.objects.filter(state=TodoState.DONE).values_list("pk", flat=True)) == {
        t.pk for t in graveyard["keyerror"]
    }


def test_staff_who_may_only_view_see_groups_without_actions(client, django_user_model, graveyard):
    from django.contrib.auth.models import Permission

    viewer = django_user_model.objects.create_user("viewer", password="pw-12345678", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_todo"))
    client.force_login(viewer)
    groups = client.get(reverse(CHANGELIST), {"dead": "yes"}).context["error_groups"]
    assert groups and all(g["actions"] == [] for g in groups)


def test_the_console_is_branded_switchboard(admin_client):
    body = admin_client.page(reverse("admin:index"))
    assert "<title>Operations | Switchboard</title>" in body
    assert "Django administration" not in body
    login = admin_client.get(reverse("admin:login") + "?next=/admin/")
    assert b"Django administration" not in login.content


def test_the_box_groups_only_the_newest_dead_letters_and_says_so(admin_client, make_todo, monkeypatch):
    # After an outage the list holds 50,000 dead-letters; grouping them all on every page load read
    # every one's errors (bench/admin/admin_changelist.py). The box groups the newest error_group_sample.
    from datetime import timedelta

    from django.utils import timezone

    from todos.admin import TodoAdmin

    monkeypatch.setattr(TodoAdmin, "error_group_sample", 3)
    now = timezone.now()
    for age in range(2):
        _dead(make_todo, "old cause", updated_at=now - timedelta(hours=5 + age))
    for age in range(3):
        _dead(make_todo, "new cause", updated_at=now - timedelta(minutes=age))
    response = admin_client.ok(reverse(CHANGELIST), {"dead": "yes"})
    assert [(g["count"], g["error"]) for g in response.context["error_groups"]] == [(3, "new cause")]
    assert response.context["error_groups_sample"] == 3
    assert "Grouped over the newest 3 dead-letters" in response.content.decode()
    # A group's link and actions still cover every matching dead-letter, not the sample.
    everyone = admin_client.ok(reverse(CHANGELIST), {"dead": "yes", "error": "old cause"})
    assert everyone.context["cl"].result_count == 2


def test_a_list_within_the_sample_is_grouped_whole_without_the_note(admin_client, graveyard):
    response = admin_client.ok(reverse(CHANGELIST), {"dead": "yes"})
    assert response.context["error_groups_sample"] is None
    assert "Grouped over the newest" not in response.content.decode()
