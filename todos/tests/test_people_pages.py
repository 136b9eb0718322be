"""The decision page, signed links and the inbox (issue 29), over HTTP through the whole Django stack
(CSRF enforced): a person decides from a link or after signing in, a forwarded link is useless once used,
and the inbox lists what waits for the person, as HTML and as JSON."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from todos import notices
from todos.models import DecisionLink, Todo, TodoState, Waitpoint
from todos.tests.test_admin import _messages, _post_action
from todos.tests.test_people_waits import ask, folks, people

__all__ = ["folks"]  # the fixture, imported for pytest


def link_for(todo_id: str, to: str) -> str:
    """The signed link the email to ``to`` carries, as a path."""
    mail = Todo.objects.get(queue=notices.NOTIFY_QUEUE, kind="notify.email", payload__to=to)
    url = mail.payload["notice"]["links"]["decide"]
    assert url.startswith("http://testserver/decide/") or url.startswith("http://localhost:8000/decide/")
    return "/" + url.split("://", 1)[1].split("/", 1)[1]


def csrf(page: Any) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert match, page.content
    return match.group(1)


def browser() -> Client:
    return Client(enforce_csrf_checks=True)


def open_link(client: Client, link: str) -> Any:
    """What a person does with a link: its GET shows one button (spending nothing), whose POST spends it.
    Returns the POST's answer, or the GET's when it showed no button."""
    shown = client.get(link)
    if shown.status_code != 200:
        return shown
    path, token = link.split("?t=", 1)
    return client.post(path, {"csrfmiddlewaretoken": csrf(shown), "action": "open_link", "t": token})


@pytest.mark.django_db
def test_a_signed_link_lets_its_person_decide_that_one_question(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    phone = browser()
    link = link_for(todo_id, "dana@example.com")
    shown = phone.get(link)  # a mail scanner's fetch: a button, nothing spent, nothing shown of the question
    assert shown.status_code == 200 and "Open the question" in shown.content.decode()
    assert "refund" not in shown.content.decode()
    assert DecisionLink.objects.get(todo_id=todo_id, user=folks["dana"]).used_at is None
    opened = open_link(phone, link)
    assert opened.status_code == 302 and opened["Location"] == f"/decide/{todo_id}/"
    assert opened["Referrer-Policy"] == "no-referrer"
    page = phone.get(f"/decide/{todo_id}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "<strong>refund</strong>" in html and "<code>ada@example.com</code>" in html
    assert 'value="approve"' in html and 'name="f_amount"' in html
    assert page["Cache-Control"].startswith("max-age=0") or "no-cache" in page["Cache-Control"]
    # Not a login: the inbox and the admin still ask for one.
    assert phone.get("/inbox/").status_code == 302
    assert phone.get("/admin/").status_code == 302
    done = phone.post(
        f"/decide/{todo_id}/",
        {"csrfmiddlewaretoken": csrf(page), "decision": "approve", "text": "ok"},
    )
    assert done.status_code == 200, done.content
    todo = Todo.objects.get(pk=todo_id)
    assert todo.state == TodoState.PENDING
    assert todo.resolution["decision"] == "approve" and todo.resolution["decided_by"] == "dana"


@pytest.mark.django_db
def test_a_forwarded_link_is_useless_once_used(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    link = link_for(todo_id, "dana@example.com")
    assert open_link(browser(), link).status_code == 302
    stranger = browser()
    assert stranger.get(link).status_code == 403  # the button is not even shown
    assert stranger.post(link.split("?t=")[0], {"action": "open_link", "t": link.split("?t=")[1]}).status_code == 403
    assert stranger.get(f"/decide/{todo_id}/").status_code == 302  # to the login, nothing shown
    assert DecisionLink.objects.get(todo_id=todo_id, user=folks["dana"]).used_at is not None


@pytest.mark.django_db
def test_a_link_for_another_todo_or_an_expired_one_opens_nothing(api, make_todo, folks):
    first = ask(api, make_todo).json()["id"]
    second = ask(api, make_todo).json()["id"]
    mails = Todo.objects.filter(queue=notices.NOTIFY_QUEUE, kind="notify.email", payload__to="dana@example.com")
    links = {m.payload["notice"]["data"]["todo"]: m.payload["notice"]["links"]["decide"] for m in mails}
    token = links[first].split("?t=", 1)[1]
    assert open_link(browser(), f"/decide/{second}/?t={token}").status_code == 403  # bound to its todo
    DecisionLink.objects.filter(todo_id=first).update(expires_at="2000-01-01T00:00:00Z")
    assert open_link(browser(), f"/decide/{first}/?t={token}").status_code == 403


@pytest.mark.django_db
def test_the_page_asks_for_a_login_and_refuses_people_it_does_not_ask(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    anonymous = browser().get(f"/decide/{todo_id}/")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/?next=")
    mallory = browser()
    mallory.force_login(folks["mallory"])
    assert mallory.get(f"/decide/{todo_id}/").status_code == 403
    assert mallory.get("/decide/td_nope/").status_code == 403  # the same answer: ids do not leak


@pytest.mark.django_db
def test_signing_in_through_the_login_page_then_editing(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    erin = browser()
    login = erin.get(f"/login/?next=/decide/{todo_id}/")
    signed = erin.post(
        "/login/",
        {
            "csrfmiddlewaretoken": csrf(login),
            "username": "erin",
            "password": "pw-erin-123",
            "next": f"/decide/{todo_id}/",
        },
    )
    assert signed.status_code == 302 and signed["Location"] == f"/decide/{todo_id}/"
    page = erin.get(f"/decide/{todo_id}/")
    form = {"csrfmiddlewaretoken": csrf(page), "decision": "edit", "f_to": "bob@example.com", "f_amount": "90"}
    refused = erin.post(f"/decide/{todo_id}/", {**form, "f_amount": "5000"})
    assert refused.status_code == 400 and "at most 1000" in refused.content.decode()
    assert Todo.objects.get(pk=todo_id).state == TodoState.WAITING
    done = erin.post(f"/decide/{todo_id}/", {**form, "f_tone": "formal"})
    assert done.status_code == 200, done.content
    resolution = Todo.objects.get(pk=todo_id).resolution
    assert resolution["edited"] == {"to": "bob@example.com", "amount": 90, "urgent": False, "tone": "formal"}
    assert resolution["decided_by"] == "erin"
    again = erin.post(f"/decide/{todo_id}/", {"csrfmiddlewaretoken": csrf(page), "decision": "approve"})
    assert again.status_code in (403, 409)


@pytest.mark.django_db
def test_a_post_without_the_csrf_token_is_refused(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    dana = browser()
    dana.force_login(folks["dana"])
    assert dana.post(f"/decide/{todo_id}/", {"decision": "approve"}).status_code == 403
    assert Todo.objects.get(pk=todo_id).state == TodoState.WAITING


@pytest.mark.django_db
def test_the_loser_of_two_clicks_sees_who_decided(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    dana, erin = browser(), browser()
    dana.force_login(folks["dana"])
    erin.force_login(folks["erin"])
    dana_page, erin_page = dana.get(f"/decide/{todo_id}/"), erin.get(f"/decide/{todo_id}/")
    assert (
        dana.post(f"/decide/{todo_id}/", {"csrfmiddlewaretoken": csrf(dana_page), "decision": "approve"}).status_code
        == 200
    )
    lost = erin.post(f"/decide/{todo_id}/", {"csrfmiddlewaretoken": csrf(erin_page), "decision": "reject"})
    assert lost.status_code == 409 and "Already decided by dana at" in lost.content.decode()


@pytest.mark.django_db
def test_the_inbox_lists_what_waits_for_the_person_oldest_first_as_html_and_json(api, make_todo, folks):
    first = ask(api, make_todo).json()["id"]
    second = ask(api, make_todo, people(users=["mallory"], groups=[], title="Only mallory")).json()["id"]
    third = ask(api, make_todo, people(title="Second for erin")).json()["id"]
    Waitpoint.objects.filter(pk=third).update(reminded_at="2026-01-01T00:00:00Z")
    erin = browser()
    erin.force_login(folks["erin"])
    listed = erin.get("/inbox/?format=json").json()["waiting"]
    assert [item["todo"] for item in listed] == [first, third]
    assert listed[0]["asked_by"] == "alice" and listed[0]["sla"] == "open" and listed[1]["sla"] == "reminded"
    assert listed[0]["age_seconds"] >= 0 and listed[0]["url"] == f"/decide/{first}/"
    assert erin.get("/inbox/", HTTP_ACCEPT="application/json").json()["waiting"] == listed
    html = erin.get("/inbox/").content.decode()
    assert "Second for erin" in html and "Only mallory" not in html and second not in html
    assert browser().get("/inbox/?format=json").status_code == 401


@pytest.mark.django_db
def test_an_operator_reassigns_from_the_page_and_it_is_recorded(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    sam = User.objects.create_user("sam", "sam@example.com", "pw-sam-123", is_staff=True)
    sam.user_permissions.add(Permission.objects.get(codename="change_todo"))
    operator = browser()
    operator.force_login(sam)
    page = operator.get(f"/decide/{todo_id}/")
    assert "Reassign (operators)" in page.content.decode()
    moved = operator.post(
        f"/decide/{todo_id}/",
        {"csrfmiddlewaretoken": csrf(page), "action": "reassign", "users": "mallory", "groups": ""},
    )
    assert moved.status_code == 200, moved.content
    assert Waitpoint.objects.get(pk=todo_id).decider_users == [folks["mallory"].pk]
    assert any(e["error"] == "people reassigned" and e["by"] == "sam" for e in Todo.objects.get(pk=todo_id).errors)
    # A person the wait asks, but not an operator, cannot reassign.
    dana = browser()
    dana.force_login(folks["mallory"])
    page = dana.get(f"/decide/{todo_id}/")
    assert "Reassign (operators)" not in page.content.decode()
    refused = dana.post(
        f"/decide/{todo_id}/", {"csrfmiddlewaretoken": csrf(page), "action": "reassign", "users": "mallory"}
    )
    assert refused.status_code == 403


@pytest.mark.django_db
@pytest.mark.parametrize("verdict", ["approve", "reject"])
def test_the_admins_approve_and_reject_decide_a_question_as_a_person(api, make_todo, folks, admin_client, verdict):
    todo_id = ask(api, make_todo).json()["id"]
    response = _post_action(admin_client, verdict, [todo_id], confirm="yes", note="seen by ops")
    verb = "approved" if verdict == "approve" else "rejected"
    assert _messages(response) == [f"1 {verb}."]
    resolution = Todo.objects.get(pk=todo_id).resolution
    assert resolution["by"] == "person" and resolution["decision"] == verdict
    assert resolution["decided_by"] == "admin" and resolution["text"] == "seen by ops"


@pytest.mark.django_db
def test_a_question_whose_notices_dead_lettered_is_still_in_the_inbox_and_decidable(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    Todo.objects.filter(queue=notices.NOTIFY_QUEUE).update(
        state=TodoState.FAILED, attempt=8, max_attempts=8, errors=[{"error": "could not connect"}]
    )
    erin = browser()
    erin.force_login(folks["erin"])
    assert [item["todo"] for item in erin.get("/inbox/?format=json").json()["waiting"]] == [todo_id]
    page = erin.get(f"/decide/{todo_id}/")
    assert (
        erin.post(f"/decide/{todo_id}/", {"csrfmiddlewaretoken": csrf(page), "decision": "approve"}).status_code == 200
    )
    assert Todo.objects.get(pk=todo_id).state == TodoState.PENDING


@pytest.mark.django_db
def test_the_form_keeps_the_schemas_field_order_and_the_admin_links_the_page(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    dana = browser()
    dana.force_login(folks["dana"])
    html = dana.get(f"/decide/{todo_id}/").content.decode()
    order = [html.index(f'name="f_{name}"') for name in ("to", "amount", "urgent", "tone")]
    assert order == sorted(order)
    # An operator of this test's own, not pytest-django's shared "admin" (whatever an earlier test left of it).
    operator = browser()
    operator.force_login(User.objects.create_superuser("people-pages-operator", "op@example.com", "pw-op-123"))
    answer = operator.get(reverse("admin:todos_todo_change", args=[quote(todo_id)]))
    assert answer.status_code == 200, (answer.status_code, answer.get("Location"))
    admin_page = answer.content.decode()
    assert f'href="/decide/{todo_id}/"' in admin_page and "Open the decision page" in admin_page


@pytest.mark.django_db
@pytest.mark.parametrize("amount", ["nan", "inf", "-inf", "1e400", "12.5", "ten"])
def test_an_edit_field_that_is_not_a_finite_number_of_its_type_is_400(api, make_todo, folks, amount):
    todo_id = ask(api, make_todo).json()["id"]
    dana = browser()
    dana.force_login(folks["dana"])
    page = dana.get(f"/decide/{todo_id}/")
    form = {"csrfmiddlewaretoken": csrf(page), "decision": "edit", "f_to": "x@example.com", "f_amount": amount}
    refused = dana.post(f"/decide/{todo_id}/", form)
    assert refused.status_code == 400, refused.content
    assert Todo.objects.get(pk=todo_id).state == TodoState.WAITING
