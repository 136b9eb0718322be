"""Staff sessions get exactly their Django permissions over REST, as in the admin (issue 28, finding M1).

Each test logs in through the admin's login form and sends the session cookie with its CSRF token, as a
browser (or a stolen cookie) would, through the real test client with CSRF checks on."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db.models.functions import Now
from django.test import Client

from events.models import Event
from ingest import routing
from ingest.models import Route, Source
from todos.models import Agent, LoginThrottle, Queue, Todo, TodoState

V1 = "/api/v1"
PASSWORD = "a-long-password-for-staff-1"


class Session:
    """A staff user's browser: logged in through /admin/login/, every write sends the CSRF token."""

    def __init__(self, username: str) -> None:
        self.client = Client(enforce_csrf_checks=True)
        self.client.get("/admin/login/")
        response = self.client.post(
            "/admin/login/",
            {"username": username, "password": PASSWORD, "csrfmiddlewaretoken": self._csrf(), "next": "/admin/"},
        )
        assert response.status_code == 302, response.content[:500]

    def _csrf(self) -> str:
        return self.client.cookies["csrftoken"].value

    def get(self, path: str) -> Any:
        return self.client.get(V1 + path)

    def send(self, method: str, path: str, body: Any = None) -> Any:
        call = getattr(self.client, method)
        headers = {"X-CSRFToken": self._csrf()}
        return call(V1 + path, data=json.dumps(body or {}), content_type="application/json", headers=headers)

    def post(self, path: str, body: Any = None) -> Any:
        return self.send("post", path, body)


def _staff(username: str, *permissions: str) -> Session:
    user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    for name in permissions:
        app, codename = name.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return Session(username)


VIEW_ONLY = ("todos.view_todo", "todos.view_queue", "events.view_event")


@pytest.fixture
def world(db: None, make_todo: Any) -> dict[str, Any]:
    source = Source.objects.create(slug="gh", provider="github", secret="s")
    Route.objects.create(source=source, event_pattern="*", queue="billing")
    event = Event.objects.create(source="gh", type="push", delivery_id="1", payload={"n": 1})
    routing.route_event(event, routing.active_routes("gh"))
    Todo.objects.filter(event=event).update(state=TodoState.DONE, completed_at=event.received_at)
    return {
        "pending": make_todo("billing"),
        "scheduled": make_todo("billing", delay_seconds=3600),
        "dead": make_todo("billing", state=TodoState.FAILED, next_retry_at=None, attempt=5, max_attempts=5),
        "event": event,
    }


def _refused(response: Any, needs: str) -> None:
    assert response.status_code == 403, response.content
    assert response.json()["error"]["code"] == "forbidden"
    assert needs in response.json()["error"]["detail"]


def test_a_view_only_staff_user_reads_but_every_operator_power_and_every_claim_is_refused(
    world: dict[str, Any],
) -> None:
    ops = _staff("viewer", *VIEW_ONLY)
    pending, scheduled, dead, event = world["pending"], world["scheduled"], world["dead"], world["event"]
    # Reads: what the admin shows it.
    assert pending.id in [t["id"] for t in ops.get("/todos/").json()["results"]]
    assert ops.get(f"/todos/{dead.id}/").status_code == 200
    assert ops.get("/queues/billing/").status_code == 200
    assert ops.get(f"/events/{event.id}/").status_code == 200

    _refused(ops.post("/queues/billing/pause/"), "todos.change_queue")
    _refused(ops.post("/queues/billing/resume/"), "todos.change_queue")
    _refused(ops.send("patch", "/queues/billing/", {"max_claimed": 0}), "todos.change_queue")
    _refused(ops.post(f"/todos/{dead.id}/retry/", {"mode": "reset"}), "todos.change_todo")
    _refused(ops.post(f"/todos/{pending.id}/cancel/", {"reason": "x"}), "todos.change_todo")
    _refused(ops.post(f"/todos/{scheduled.id}/run-now/"), "todos.change_todo")
    _refused(ops.send("patch", f"/todos/{pending.id}/", {"priority": -5}), "todos.change_todo")
    _refused(ops.post(f"/events/{event.id}/replay/"), "todos.change_todo")
    _refused(ops.post(f"/todos/{pending.id}/resolve/", {"data": {"approved": True}}), "todos.change_todo")
    _refused(ops.post("/todos/", {"queue": "billing"}), "todos.add_todo")
    _refused(ops.post("/todos/batch/", {"todos": [{"queue": "billing"}]}), "todos.add_todo")
    _refused(ops.post("/todos/claim/", {"limit": 100}), "Staff sessions do not take work")
    _refused(ops.post("/todos/claim/", {"limit": 1, "wait_seconds": 1}), "Staff sessions do not take work")
    _refused(ops.post(f"/todos/{pending.id}/claim/"), "Staff sessions do not take work")

    # Nothing changed.
    queue = Queue.objects.get(name="billing")
    assert not queue.paused and queue.max_claimed is None
    states = dict(Todo.objects.filter(queue="billing").values_list("id", "state"))
    assert states[pending.id] == TodoState.PENDING and states[scheduled.id] == TodoState.SCHEDULED
    assert states[dead.id] == TodoState.FAILED
    assert Todo.objects.get(pk=pending.id).priority == 0
    assert Todo.objects.filter(queue="billing").count() == 4  # no create, no replay


def test_a_staff_user_without_todo_permissions_sees_nothing(world: dict[str, Any]) -> None:
    ops = _staff("nobody")
    assert ops.get("/todos/").json()["results"] == []
    assert ops.get(f"/todos/{world['pending'].id}/").status_code == 404
    assert ops.get(f"/events/{world['event'].id}/").status_code == 404
    assert ops.post(f"/todos/{world['pending'].id}/cancel/").status_code == 404


def test_change_todo_retries_and_cancels_but_does_not_pause(world: dict[str, Any]) -> None:
    ops = _staff("operator", "todos.change_todo")
    response = ops.post(f"/todos/{world['dead'].id}/retry/", {"mode": "reset"})
    assert response.status_code == 200 and response.json()["state"] == TodoState.PENDING
    response = ops.post(f"/todos/{world['pending'].id}/cancel/", {"reason": "duplicate"})
    assert response.status_code == 200 and response.json()["state"] == TodoState.CANCELLED
    assert response.json()["errors"][-1]["cancelled_by"] == "staff:operator"
    assert ops.post(f"/todos/{world['scheduled'].id}/run-now/").status_code == 200
    assert ops.post(f"/events/{world['event'].id}/replay/").status_code == 404  # it may not see events
    _refused(ops.post("/queues/billing/pause/"), "todos.change_queue")
    assert not Queue.objects.get(name="billing").paused


def test_change_queue_pauses_and_limits(world: dict[str, Any]) -> None:
    ops = _staff("queues", "todos.view_todo", "todos.change_queue")
    assert ops.post("/queues/billing/pause/").json()["paused"] is True
    assert ops.send("patch", "/queues/billing/", {"max_claimed": 3}).json()["max_claimed"] == 3
    _refused(ops.post(f"/todos/{world['dead'].id}/retry/", {"mode": "reset"}), "todos.change_todo")


def test_change_todo_and_view_event_replays(world: dict[str, Any]) -> None:
    ops = _staff("replayer", "todos.change_todo", "events.view_event")
    response = ops.post(f"/events/{world['event'].id}/replay/")
    assert response.status_code == 200 and len(response.json()["created_todo_ids"]) == 1


def test_add_todo_creates(world: dict[str, Any]) -> None:
    ops = _staff("producer", "todos.add_todo")
    response = ops.post("/todos/", {"queue": "billing", "title": "by hand"})
    assert response.status_code == 201, response.content


def test_even_a_superuser_session_takes_no_work(world: dict[str, Any], make_agent: Any) -> None:
    User.objects.create_superuser("root", "root@example.com", PASSWORD)
    ops = Session("root")
    _refused(ops.post("/todos/claim/", {"limit": 1}), "Staff sessions do not take work")
    worker: Agent = make_agent("worker", claim=["billing"])
    claimed = (
        Client()
        .post(
            f"{V1}/todos/{world['pending'].id}/claim/",
            data="{}",
            content_type="application/json",
            headers={"Authorization": f"Bearer {worker.token}"},  # type: ignore[attr-defined]
        )
        .json()
    )
    receipt = {"lease_id": claimed["lease_id"]}
    for verb in ("heartbeat", "complete", "fail", "release"):
        _refused(ops.post(f"/todos/{claimed['id']}/{verb}/", receipt), "Staff sessions do not take work")
    _refused(
        ops.post(f"/todos/{claimed['id']}/wait/", {**receipt, "for": {"token": True}, "timeout_seconds": 60}),
        "Staff sessions do not take work",
    )
    _refused(ops.post("/todos/complete/", {"items": [{**receipt, "id": claimed["id"]}]}), "Staff sessions")
    assert Todo.objects.get(pk=claimed["id"]).state == TodoState.CLAIMED
    # The superuser still operates.
    assert ops.post("/queues/billing/pause/").status_code == 200


# --- the console's login: failures per name and per address lock it (L6) --------------------------------
def _login(username: str, password: str, address: str = "203.0.113.7") -> Any:
    client = Client()
    response = client.post(
        "/admin/login/?next=/admin/", {"username": username, "password": password}, REMOTE_ADDR=address
    )
    return response


LOCKED = "Too many failed logins"


def test_guessing_a_staff_password_locks_the_name_even_for_the_right_password(db: None) -> None:
    User.objects.create_user("ops", password=PASSWORD, is_staff=True)
    for guess in range(5):
        answer = _login("ops", f"guess-{guess}")
        assert answer.status_code == 200 and LOCKED not in answer.content.decode()
    # The sixth try is refused before its password is checked: even the right one, from anywhere.
    for address in ("203.0.113.7", "198.51.100.1"):
        answer = _login("OPS", PASSWORD, address)
        assert answer.status_code == 200 and LOCKED in answer.content.decode(), answer.content[:300]
        assert "_auth_user_id" not in answer.client.session
    # Another person logs in meanwhile; and once the lockout has ended, so does this one.
    User.objects.create_user("other", password=PASSWORD, is_staff=True)
    assert _login("other", PASSWORD, "198.51.100.1").status_code == 302
    LoginThrottle.objects.update(
        window_started_at=Now() - timedelta(hours=1), locked_until=Now() - timedelta(minutes=1)
    )
    assert _login("ops", PASSWORD).status_code == 302


def test_a_success_clears_the_names_count(db: None) -> None:
    User.objects.create_user("ops", password=PASSWORD, is_staff=True)
    for _ in range(4):
        _login("ops", "wrong")
    assert _login("ops", PASSWORD).status_code == 302
    for _ in range(4):
        _login("ops", "wrong")
    assert _login("ops", PASSWORD).status_code == 302


def test_spraying_names_from_one_address_locks_that_address(db: None, settings: Any) -> None:
    settings.ADMIN_LOGIN_MAX_FAILURES_PER_ADDRESS = 3
    User.objects.create_user("ops", password=PASSWORD, is_staff=True)
    for name in ("admin", "root", "alice"):
        assert LOCKED not in _login(name, "password1", "192.0.2.66").content.decode()
    answer = _login("ops", PASSWORD, "192.0.2.66")
    assert answer.status_code == 200 and LOCKED in answer.content.decode()
    assert _login("ops", PASSWORD, "192.0.2.67").status_code == 302


def test_the_queue_dashboard_needs_a_view_permission(world: dict[str, Any]) -> None:
    assert _staff("nobody").client.get("/admin/dashboard.json").status_code == 403
    assert _staff("looker", "todos.view_queue").client.get("/admin/dashboard.json").status_code == 200
