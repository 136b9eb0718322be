"""Outbound notices, the enqueue side (issue 29, todos/notices.py): one delivery todo per channel per
recipient in the system queue, idempotent per (notice key, recipient, channel)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from todos.models import NotifyEndpoint, Todo
from todos.notices import NOTIFY_QUEUE, Notice, notify_url, notify_users

NOTICE = Notice(
    key="wait:td_1:asked",
    event="wait.asked",
    subject="Merge PR #7?",
    text="The agent asks: merge **PR #7**?",
    links={"open": "https://sb.example/inbox/td_1/"},
    data={"todo": "td_1"},
)


@pytest.fixture
def people(db):
    ann = User.objects.create_user("ann", email="ann@example.com")
    bob = User.objects.create_user("bob", email="bob@example.com")
    nomail = User.objects.create_user("carl")
    reviewers = Group.objects.create(name="reviewers")
    bob.groups.add(reviewers)
    return ann, bob, nomail, reviewers


def test_each_user_gets_an_email_and_each_endpoint_a_webhook(people):
    ann, _bob, nomail, reviewers = people
    mine = NotifyEndpoint.objects.create(user=ann, url="http://127.0.0.1:9/hook")
    theirs = NotifyEndpoint.objects.create(group=reviewers, url="http://127.0.0.1:9/group")
    NotifyEndpoint.objects.create(user=ann, url="http://127.0.0.1:9/off", active=False)
    NotifyEndpoint.objects.create(user=ann, url="http://127.0.0.1:9/other", events=["todo.done"])
    ids = notify_users(users=[ann, nomail], groups=[reviewers], notice=NOTICE)
    todos = {t.id: t for t in Todo.objects.filter(id__in=ids)}
    assert len(todos) == 4 and {t.queue for t in todos.values()} == {NOTIFY_QUEUE}
    channels = sorted((t.payload["channel"], t.payload.get("endpoint") or t.payload.get("to")) for t in todos.values())
    assert channels == sorted(
        [("webhook", mine.pk), ("webhook", theirs.pk), ("email", "ann@example.com"), ("email", "bob@example.com")]
    )
    assert all(t.payload["notice"]["key"] == NOTICE.key for t in todos.values())


def test_a_retried_caller_enqueues_each_delivery_once(people):
    ann, *_ = people
    first = notify_users(users=[ann], notice=NOTICE)
    again = notify_users(users=[ann], notice=NOTICE)
    assert first == again and Todo.objects.filter(queue=NOTIFY_QUEUE).count() == 1


def test_links_for_gives_each_person_their_own_links(people):
    ann, bob, _, _ = people
    ids = notify_users(users=[ann, bob], notice=NOTICE, links_for=lambda u: {"approve": f"https://x/{u.username}"})
    links = sorted(t.payload["notice"]["links"]["approve"] for t in Todo.objects.filter(id__in=ids))
    assert links == ["https://x/ann", "https://x/bob"]


def test_notify_url_enqueues_one_signed_webhook(db):
    todo_id = notify_url(url="http://127.0.0.1:9/cb", secret="whsec_c2VjcmV0", notice=NOTICE)
    assert notify_url(url="http://127.0.0.1:9/cb", secret="whsec_c2VjcmV0", notice=NOTICE) == todo_id
    todo = Todo.objects.get(id=todo_id)
    assert (todo.queue, todo.payload["channel"], todo.payload["url"]) == (NOTIFY_QUEUE, "url", "http://127.0.0.1:9/cb")


def test_a_users_own_endpoint_gets_their_links_and_a_groups_endpoint_the_notices(people):
    ann, _bob, _, reviewers = people
    mine = NotifyEndpoint.objects.create(user=ann, url="http://127.0.0.1:9/mine")
    theirs = NotifyEndpoint.objects.create(group=reviewers, url="http://127.0.0.1:9/group")
    calls: list[str] = []

    def links_for(user: User) -> dict[str, str]:
        calls.append(user.username)
        return {"approve": f"https://x/{user.username}"}

    ids = notify_users(users=[ann], groups=[reviewers], notice=NOTICE, links_for=links_for)
    by_endpoint = {t.payload.get("endpoint"): t.payload["notice"]["links"] for t in Todo.objects.filter(id__in=ids)}
    assert by_endpoint[mine.pk] == {"approve": "https://x/ann"}
    assert by_endpoint[theirs.pk] == NOTICE.links
    assert sorted(calls) == ["ann", "bob"]  # once per person, the endpoint and the email sharing ann's
