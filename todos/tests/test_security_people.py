"""Hostile agents and people against waits for people (issue 29). Every agent token is assumed
compromised (issue 28): no agent may decide a person's question, over REST or MCP, whatever its scopes or
staff rights; a question's text is rendered as text; a signed link opens one decision for one person, once,
and nothing else."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from todos import queue
from todos.models import Todo, TodoState, Waitpoint
from todos.tests.mcp_live import mcp_base
from todos.tests.test_mcp_tasks import create_task, get_task, modern
from todos.tests.test_people_pages import csrf, link_for, open_link
from todos.tests.test_people_waits import DAY, ask, folks, people

__all__ = ["folks", "mcp_base"]  # fixtures, imported for pytest


def json_deep(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def _still_waiting(todo_id: str) -> None:
    todo = Todo.objects.get(pk=todo_id)
    assert todo.state == TodoState.WAITING and todo.resolution is None
    assert Waitpoint.objects.get(pk=todo_id).resolved_at is None


@pytest.mark.django_db
def test_the_waiting_agent_cannot_resolve_its_own_question_over_rest(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    refused = api.post(f"/todos/{todo_id}/resolve/", {"data": {"decision": "approve"}})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    _still_waiting(todo_id)


@pytest.mark.django_db
def test_another_agent_even_a_staff_one_cannot_resolve_a_question_for_people(
    api, api_for, make_agent, make_todo, folks
):
    todo_id = ask(api, make_todo).json()["id"]
    other = api_for(make_agent("bystander"))
    assert other.post(f"/todos/{todo_id}/resolve/", {"data": {}}).status_code == 403
    # Even an operator's session on the API acts as an agent there: a person decides on /decide/<id>/.
    operator = User.objects.create_user("ops", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="change_todo"))
    staff = Client()
    staff.force_login(operator)
    refused = staff.post(f"/api/v1/todos/{todo_id}/resolve/", {"data": 1}, content_type="application/json")
    assert refused.status_code == 403
    _still_waiting(todo_id)


@pytest.mark.django_db(transaction=True)
def test_over_mcp_an_agent_asks_people_and_no_agent_can_answer_for_them(mcp_base, agent, make_agent, folks):
    """The MCP wait tool opens a wait for people; the task it belongs to reads input_required (TASK_STATES:
    someone must answer), but only a named person can: tasks/update from the waiting agent or another one
    changes nothing, REST's resolve from either is 403; the person's decision then reaches the agent over
    MCP's get_todo."""
    task = create_task(mcp_base, agent.token)
    [claimed] = queue.claim_next(agent=agent)
    args = {"id": claimed.id, "lease_id": claimed.lease_id, "for": people(), "timeout_seconds": DAY}
    waited = modern(mcp_base, agent.token, "tools/call", {"name": "wait", "arguments": args}, tasks=False)
    assert waited["result"]["structuredContent"]["todo"]["state"] == "waiting", waited
    assert get_task(mcp_base, agent.token, task["taskId"])["result"]["status"] == "input_required"
    other = make_agent("bystander")
    for token in (agent.token, other.token):
        answer = {"action": "accept", "content": {"decision": "approve"}}
        modern(mcp_base, token, "tasks/update", {"taskId": claimed.id, "inputResponses": {"resolve-x": answer}})
        rest = Client(headers={"authorization": f"Bearer {token}"}).post(
            f"/api/v1/todos/{claimed.id}/resolve/", data="{}", content_type="application/json"
        )
        assert rest.status_code in (403, 404)
    _still_waiting(claimed.id)
    queue.decide(claimed.id, user=folks["dana"], decision="edit", edited={"to": "x@example.com", "amount": 3})
    shown = modern(
        mcp_base, agent.token, "tools/call", {"name": "get_todo", "arguments": {"id": claimed.id}}, tasks=False
    )
    resolution = shown["result"]["structuredContent"]["todo"]["resolution"]
    assert resolution["by"] == "person" and resolution["edited"] == {"to": "x@example.com", "amount": 3}


@pytest.mark.django_db
def test_the_question_renders_as_text_never_as_markup(api, make_todo, folks):
    hostile = people(
        title='<img src=x onerror="alert(1)">',
        body='<script>alert(1)</script>\n\n[click](javascript:alert(1)) [ok](https://example.com/a"onmouseover="x)',
        arguments={"to": "</pre><script>alert(2)</script>", "amount": 1},
    )
    todo_id = ask(api, make_todo, hostile).json()["id"]
    dana = Client()
    dana.force_login(folks["dana"])
    html = dana.get(f"/decide/{todo_id}/").content.decode()
    assert "<script>" not in html and "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'href="javascript' not in html and "onmouseover=" not in html.replace("&quot;onmouseover=&quot;", "")


@pytest.mark.django_db
def test_a_spent_links_grant_opens_only_its_own_question(api, make_todo, folks):
    first = ask(api, make_todo).json()["id"]
    second = ask(api, make_todo, people(title="Another question")).json()["id"]
    phone = Client()
    mails = Todo.objects.filter(kind="notify.email", payload__to="dana@example.com")
    link = next(m.payload["notice"]["links"]["decide"] for m in mails if m.payload["notice"]["data"]["todo"] == first)
    before = phone.get("/inbox/")  # a session of its own before the link
    assert before.status_code == 302
    key_before = phone.cookies.get("sessionid")
    assert open_link(phone, "/" + link.split("://", 1)[1].split("/", 1)[1]).status_code == 302
    assert phone.cookies.get("sessionid") != key_before  # a fresh session key: no fixation
    assert phone.get(f"/decide/{first}/").status_code == 200
    assert phone.get(f"/decide/{second}/").status_code == 302  # to the login: the grant is for one todo
    assert phone.get("/inbox/").status_code == 302
    assert phone.get("/admin/todos/todo/").status_code == 302


@pytest.mark.django_db
def test_a_grant_stops_working_once_its_person_no_longer_decides(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    phone = Client(enforce_csrf_checks=True)
    assert open_link(phone, link_for(todo_id, "dana@example.com")).status_code == 302
    page = phone.get(f"/decide/{todo_id}/")
    queue.reassign(todo_id, by="ops", users=["mallory"], groups=[])
    refused = phone.post(f"/decide/{todo_id}/", {"csrfmiddlewaretoken": csrf(page), "decision": "approve"})
    assert refused.status_code == 403
    _still_waiting(todo_id)


@pytest.mark.django_db
def test_an_inactive_person_cannot_decide_even_with_a_link(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    link = link_for(todo_id, "dana@example.com")
    User.objects.filter(username="dana").update(is_active=False)
    phone = Client()
    open_link(phone, link)
    assert phone.get(f"/decide/{todo_id}/").status_code == 302
    _still_waiting(todo_id)


@pytest.mark.django_db
@pytest.mark.parametrize("token", ["", "dl_", "dl_" + "A" * 200, "wpt_guess", "dl_notarealtoken"])
def test_guessed_or_malformed_link_tokens_open_nothing(api, make_todo, folks, token):
    todo_id = ask(api, make_todo).json()["id"]
    assert Client().get(f"/decide/{todo_id}/", {"t": token}).status_code == 403
    assert Client().post(f"/decide/{todo_id}/", {"action": "open_link", "t": token}).status_code == 403
    _still_waiting(todo_id)


@pytest.mark.django_db
def test_the_login_never_redirects_off_site(folks):
    browser = Client()
    answer = browser.post(
        "/login/", {"username": "dana", "password": "pw-dana-123", "next": "https://evil.example/steal"}
    )
    assert answer.status_code == 302 and answer["Location"] == "/inbox/"


@pytest.mark.django_db
def test_a_wait_for_people_cannot_name_agent_resolvers(api, make_todo, folks):
    answer = ask(api, make_todo, resolvers=["scope:*"])
    assert answer.status_code == 400 and "resolvers" in answer.json()["error"]["fields"]


@pytest.mark.django_db
def test_a_huge_question_is_refused_before_anything_is_stored(api, make_todo, folks):
    huge = people(arguments={"blob": "x" * 60_000})
    answer = ask(api, make_todo, huge)
    assert answer.status_code == 400 and list(answer.json()["error"]["fields"]) == ["for.people"]
    assert not Waitpoint.objects.exists()


@pytest.mark.django_db
def test_the_peoples_login_is_throttled_like_the_admins(folks, settings):
    settings.ADMIN_LOGIN_MAX_FAILURES = 3
    browser = Client()
    for _ in range(3):
        wrong = browser.post("/login/", {"username": "dana", "password": "wrong-guess"})
        assert wrong.status_code == 200 and "correct username and password" in wrong.content.decode()
    locked = browser.post("/login/", {"username": "dana", "password": "pw-dana-123"})
    assert locked.status_code == 200 and "Too many failed logins" in locked.content.decode()
    assert "_auth_user_id" not in browser.session


@pytest.mark.django_db
def test_a_link_fetched_by_a_mail_scanner_is_not_spent_and_shows_nothing(api, make_todo, folks):
    todo_id = ask(api, make_todo).json()["id"]
    link = link_for(todo_id, "dana@example.com")
    scanner = Client()
    for _ in range(3):  # a scanner, a link preview, a prefetch
        shown = scanner.get(link)
        assert shown.status_code == 200 and "refund" not in shown.content.decode()
        assert scanner.head(link).status_code == 405
    assert scanner.get(f"/decide/{todo_id}/").status_code == 302  # no grant from a GET
    # The person's own click still works afterwards.
    assert open_link(Client(enforce_csrf_checks=True), link).status_code == 302


@pytest.mark.django_db
@pytest.mark.parametrize(
    "change",
    [
        {"arguments": {"a": "x\x00y"}},
        {"arguments": {"a": "\ud800"}},
        {"users": ["\ud800"]},
        {"arguments": {"a": float("nan")}},
        {"arguments": {"a": json_deep(200)}},
        {"edit_schema": {"type": "object", "properties": {"a": {"type": "number", "maximum": float("inf")}}}},
    ],
    ids=["nul", "surrogate-arguments", "surrogate-name", "nan", "deep", "infinite-bound"],
)
def test_a_question_jsonb_cannot_store_is_400_not_500(api, make_todo, folks, change):
    todo = make_todo("default")
    claimed = api.post(f"/todos/{todo.id}/claim/", {}).json()
    body = {"lease_id": claimed["lease_id"], "for": people(**change), "timeout_seconds": DAY}
    text = json.dumps(body, allow_nan=True)  # as a hostile client would send it
    answer = api.post(f"/todos/{todo.id}/wait/", text.replace("NaN", "1e999") if "nan" in str(change) else text)
    assert answer.status_code == 400, answer.content
    assert not Waitpoint.objects.exists()
