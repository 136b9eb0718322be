"""Waits for people (issue 29): asking over REST and MCP's door, the checks on what is asked, a person's
decision and the structured resolution the agent gets, concurrent decisions, reminders and escalation."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.db import connection
from django.db.models.functions import Now

from todos import notices, queue
from todos.errors import AlreadyDecided, InvalidTransitionInput, NotAResolver
from todos.models import DecisionLink, Todo, TodoState, Waitpoint

DAY = 24 * 3600
SCHEMA = {
    "type": "object",
    "properties": {
        "to": {"type": "string", "maxLength": 200, "title": "Recipient"},
        "amount": {"type": "integer", "minimum": 1, "maximum": 1000},
        "urgent": {"type": "boolean"},
        "tone": {"type": "string", "enum": ["formal", "friendly"]},
    },
    "required": ["to", "amount"],
}


def people(**extra: Any) -> dict[str, Any]:
    return {
        "people": {
            "users": ["dana"],
            "groups": ["finance"],
            "title": "Send the refund?",
            "body": "A **refund** of 120 EUR to `ada@example.com`.",
            "decisions": ["approve", "reject", "edit", "respond"],
            "edit_schema": SCHEMA,
            "arguments": {"to": "ada@example.com", "amount": 120},
            **extra,
        }
    }


@pytest.fixture
def folks(db: None) -> dict[str, Any]:
    finance = Group.objects.create(name="finance")
    Group.objects.create(name="managers")
    dana = User.objects.create_user("dana", "dana@example.com", "pw-dana-123")
    erin = User.objects.create_user("erin", "erin@example.com", "pw-erin-123")
    erin.groups.add(finance)
    mallory = User.objects.create_user("mallory", "mallory@example.com", "pw-mallory-123")
    return {"dana": dana, "erin": erin, "mallory": mallory, "finance": finance}


def claimed(api: Any, make_todo: Any) -> dict[str, Any]:
    todo = make_todo("default")
    answer = api.post(f"/todos/{todo.id}/claim/", {})
    assert answer.status_code == 200, answer.content
    return dict(answer.json())


def ask(api: Any, make_todo: Any, wait_for: Any = None, **extra: Any) -> Any:
    todo = claimed(api, make_todo)
    body = {"lease_id": todo["lease_id"], "for": wait_for or people(), "timeout_seconds": DAY, **extra}
    return api.post(f"/todos/{todo['id']}/wait/", body)


@pytest.mark.django_db
def test_wait_for_people_waits_and_tells_them(api, make_todo, folks):
    answer = ask(api, make_todo)
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["state"] == "waiting"
    assert body["waiting_for"] == {
        "people": {
            "users": ["dana"],
            "groups": ["finance"],
            "title": "Send the refund?",
            "decisions": ["approve", "reject", "edit", "respond"],
        }
    }
    wait = Waitpoint.objects.get(pk=body["id"])
    assert wait.decider_users == [folks["dana"].pk] and wait.decider_groups == [folks["finance"].pk]
    assert wait.people["body"].startswith("A **refund**")
    # One email each to dana and erin (finance), each with their own signed link.
    sent = Todo.objects.filter(queue=notices.NOTIFY_QUEUE, kind="notify.email")
    assert sorted(t.payload["to"] for t in sent) == ["dana@example.com", "erin@example.com"]
    decide_links = {t.payload["notice"]["links"]["decide"] for t in sent}
    assert len(decide_links) == 2 and all(f"/decide/{body['id']}/?t=dl_" in link for link in decide_links)
    assert DecisionLink.objects.filter(todo_id=body["id"]).count() == 2
    assert {t.payload["notice"]["event"] for t in sent} == {"wait.asked"}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"users": ["nobody"]}, "for.people.users"),
        ({"groups": ["no-such-group"]}, "for.people.groups"),
        ({"users": [], "groups": []}, "for.people.users"),
        ({"title": ""}, "for.people.title"),
        ({"body": "x" * (8 * 1024 + 1)}, "for.people.body"),
        ({"decisions": ["approve", "ignore"]}, "for.people.decisions"),
        ({"edit_schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": ".*"}}}}, None),
        ({"edit_schema": {"type": "object", "properties": {"a": {"$ref": "#"}}}}, None),
        ({"edit_schema": {"type": "array"}}, "for.people.edit_schema"),
        ({"remind_after_seconds": 1}, "for.people.remind_after_seconds"),
        ({"escalate_after_seconds": 3600}, "for.people.escalate_to"),
        ({"escalate_after_seconds": 3600, "escalate_to": {"groups": ["ghosts"]}}, "for.people.escalate_to.groups"),
        ({"colour": "red"}, "for.people.colour"),
    ],
)
def test_wait_for_people_refuses_bad_input_naming_the_field(api, make_todo, folks, change, field):
    answer = ask(api, make_todo, people(**change))
    assert answer.status_code == 400, answer.content
    fields = answer.json()["error"]["fields"]
    assert list(fields) == [field or "for.people.edit_schema"]
    assert not Waitpoint.objects.exists()
    assert not Todo.objects.filter(queue=notices.NOTIFY_QUEUE).exists()


@pytest.mark.django_db
def test_a_wait_for_people_names_no_resolvers(api, make_todo, folks):
    answer = ask(api, make_todo, resolvers=["bob"])
    assert answer.status_code == 400
    assert list(answer.json()["error"]["fields"]) == ["resolvers"]


@pytest.mark.django_db
def test_an_edit_decision_resolves_with_the_structured_resolution(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    edited = {"to": "ada@example.com", "amount": 100, "tone": "friendly"}
    todo = queue.decide(todo_id, user=folks["erin"], decision="edit", edited=edited, text="Cap at 100.")
    assert todo.state == TodoState.PENDING
    resolution = api.get(f"/todos/{todo_id}/").json()["resolution"]
    assert resolution["by"] == "person" and resolution["decision"] == "edit"
    assert resolution["edited"] == edited and resolution["text"] == "Cap at 100."
    assert resolution["decided_by"] == "erin" and resolution["at"]
    again = api.post(f"/todos/{todo_id}/claim/", {}).json()
    assert again["resolution"]["edited"] == edited


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("decision", "edited", "text", "field"),
    [
        ("ignore", None, "", "decision"),
        ("edit", {"to": "x"}, "", "edited.amount"),
        ("edit", {"to": "x", "amount": 5000}, "", "edited.amount"),
        ("edit", {"to": "x", "amount": 5, "cc": "y"}, "", "edited"),
        ("edit", {"to": 7, "amount": 5}, "", "edited.to"),
        ("edit", {"to": "x", "amount": 5, "tone": "rude"}, "", "edited.tone"),
        ("respond", None, "  ", "text"),
        ("approve", {"to": "x"}, "", "edited"),
    ],
)
def test_a_decision_the_wait_does_not_allow_is_400_and_changes_nothing(
    api, make_todo, folks, decision, edited, text, field
):
    todo_id = ask(api, make_todo).json()["id"]
    with pytest.raises(InvalidTransitionInput) as refused:
        queue.decide(todo_id, user=folks["dana"], decision=decision, edited=edited, text=text)
    assert list(refused.value.extra["fields"]) == [field]
    assert Todo.objects.get(pk=todo_id).state == TodoState.WAITING


@pytest.mark.django_db
def test_someone_the_wait_does_not_name_cannot_decide(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    with pytest.raises(NotAResolver):
        queue.decide(todo_id, user=folks["mallory"], decision="approve")
    assert Todo.objects.get(pk=todo_id).state == TodoState.WAITING


@pytest.mark.django_db
def test_staff_with_change_todo_may_decide_and_staff_without_it_may_not(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    staff = User.objects.create_user("sam", "sam@example.com", "pw-sam-123", is_staff=True)
    with pytest.raises(NotAResolver):
        queue.decide(todo_id, user=staff, decision="approve")
    staff.user_permissions.add(Permission.objects.get(codename="change_todo"))
    staff = User.objects.get(pk=staff.pk)  # permissions are cached on the instance
    assert queue.decide(todo_id, user=staff, decision="reject").resolution["decided_by"] == "sam"


@pytest.mark.django_db
def test_a_second_decision_sees_who_decided_and_when(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    queue.decide(todo_id, user=folks["dana"], decision="approve")
    with pytest.raises(AlreadyDecided) as lost:
        queue.decide(todo_id, user=folks["erin"], decision="reject")
    assert "Already decided by dana at" in str(lost.value)
    assert Todo.objects.get(pk=todo_id).resolution["decision"] == "approve"


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_decisions_one_wins_the_other_sees_it_was_decided(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    barrier = threading.Barrier(2)
    outcomes: dict[str, Any] = {}

    def click(name: str, decision: str) -> None:
        try:
            user = User.objects.get(username=name)
            barrier.wait()
            outcomes[name] = queue.decide(todo_id, user=user, decision=decision).resolution
        except AlreadyDecided as exc:
            outcomes[name] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=click, args=a) for a in (("dana", "approve"), ("erin", "reject"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    won = [n for n, o in outcomes.items() if isinstance(o, dict)]
    lost = [n for n, o in outcomes.items() if isinstance(o, AlreadyDecided)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert f"Already decided by {won[0]} at" in str(outcomes[lost[0]])
    todo = Todo.objects.get(pk=todo_id)
    assert todo.resolution["decided_by"] == won[0]
    assert sum(1 for e in todo.errors if e.get("error") == "wait resolved") == 1


def _due(todo_id: str, column: str) -> None:
    """Move the clock: the wait's reminder (or escalation) time is in the past. An hour back: Django's Now()
    is the statement's time, the sweep's now() the test transaction's start, seconds earlier."""
    Waitpoint.objects.filter(pk=todo_id).update(**{column: Now() - timedelta(hours=1)})


@pytest.mark.django_db
def test_the_reaper_reminds_once_and_records_it(api, make_todo, folks):
    todo_id = ask(api, make_todo, people(remind_after_seconds=3600)).json()["id"]
    assert queue.reap_once(batch=10).people_reminded == 0
    _due(todo_id, "remind_at")
    assert queue.reap_once(batch=10).people_reminded == 1
    assert queue.reap_once(batch=10).people_reminded == 0
    wait = Waitpoint.objects.get(pk=todo_id)
    assert wait.reminded_at is not None
    assert [e["error"] for e in Todo.objects.get(pk=todo_id).errors].count("people reminded") == 1
    reminders = Todo.objects.filter(queue=notices.NOTIFY_QUEUE, payload__notice__event="wait.reminder")
    assert sorted(t.payload["to"] for t in reminders) == ["dana@example.com", "erin@example.com"]


@pytest.mark.django_db
def test_the_reaper_escalates_once_and_the_escalation_group_may_then_decide(api, make_todo, folks):
    boss = User.objects.create_user("boss", "boss@example.com", "pw-boss-123")
    boss.groups.add(Group.objects.get(name="managers"))
    wait_for = people(escalate_after_seconds=7200, escalate_to={"groups": ["managers"]})
    todo_id = ask(api, make_todo, wait_for).json()["id"]
    with pytest.raises(NotAResolver):
        queue.decide(todo_id, user=boss, decision="approve")
    _due(todo_id, "escalate_at")
    assert queue.reap_once(batch=10).people_escalated == 1
    assert queue.reap_once(batch=10).people_escalated == 0
    assert [e["error"] for e in Todo.objects.get(pk=todo_id).errors].count("people escalated") == 1
    told = Todo.objects.filter(queue=notices.NOTIFY_QUEUE, payload__notice__event="wait.escalated")
    assert [t.payload["to"] for t in told] == ["boss@example.com"]
    assert queue.decide(todo_id, user=boss, decision="approve").resolution["decided_by"] == "boss"


@pytest.mark.django_db
def test_a_reassignment_is_recorded_and_moves_who_may_decide(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    queue.reassign(todo_id, by="sam", users=["mallory"], groups=[])
    entry = [e for e in Todo.objects.get(pk=todo_id).errors if e["error"] == "people reassigned"]
    assert entry and entry[0]["by"] == "sam" and entry[0]["users"] == ["mallory"]
    with pytest.raises(NotAResolver):
        queue.decide(todo_id, user=folks["dana"], decision="approve")
    assert queue.decide(todo_id, user=folks["mallory"], decision="approve").state == TodoState.PENDING


@pytest.mark.django_db
def test_a_timed_out_wait_for_people_cannot_be_decided(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    Waitpoint.objects.filter(pk=todo_id).update(timeout_at=Now() - timedelta(hours=1))
    assert queue.reap_once(batch=10).waits_timed_out == 1
    with pytest.raises(Exception, match="ended"):
        queue.decide(todo_id, user=folks["dana"], decision="approve")


@pytest.mark.django_db(transaction=True)
def test_two_reapers_at_once_remind_and_escalate_each_wait_exactly_once(api, make_todo, folks):
    Group.objects.get(name="managers").user_set.add(folks["mallory"])
    wait_for = people(remind_after_seconds=60, escalate_after_seconds=120, escalate_to={"groups": ["managers"]})
    ids = [ask(api, make_todo, wait_for).json()["id"] for _ in range(6)]
    Waitpoint.objects.filter(pk__in=ids).update(
        remind_at=Now() - timedelta(hours=1), escalate_at=Now() - timedelta(hours=1)
    )
    barrier = threading.Barrier(2)
    swept: list[Any] = []

    def reap() -> None:
        try:
            barrier.wait()
            swept.append(queue.reap_once(batch=2))
        finally:
            connection.close()

    threads = [threading.Thread(target=reap) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(r.people_reminded for r in swept) == 6 and sum(r.people_escalated for r in swept) == 6
    for todo in Todo.objects.filter(pk__in=ids):
        history = [e["error"] for e in todo.errors]
        assert history.count("people reminded") == 1 and history.count("people escalated") == 1
    reminders = Todo.objects.filter(queue=notices.NOTIFY_QUEUE, payload__notice__event="wait.reminder")
    escalations = Todo.objects.filter(queue=notices.NOTIFY_QUEUE, payload__notice__event="wait.escalated")
    assert reminders.count() == 6 * 2 and escalations.count() == 6  # dana and erin each; mallory (managers)


@pytest.mark.django_db
def test_a_token_wait_still_works_beside_people_waits(api, make_todo, folks):
    answer = ask(api, make_todo, {"token": True})
    assert answer.status_code == 200
    wait = Waitpoint.objects.get(pk=answer.json()["id"])
    assert wait.people is None and wait.decider_users == [] and wait.remind_at is None
    assert queue.resolve_token(answer.json()["waitpoint"]["token"], data={"ok": True}).state == TodoState.PENDING
