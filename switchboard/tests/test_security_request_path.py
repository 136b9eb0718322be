"""Issue 32's lighter request path, attacked on the Procfile's server (gunicorn + uvicorn, real PostgreSQL).

An API request that carries a bearer token skips the session, CSRF, auth and messages middleware
(settings.SESSION_ONLY_MIDDLEWARE, switchboard/asgi.py). What must not change: such a request is the
token's and nothing else's (an invalid token never falls back to a session cookie sent beside it); a
session's requests, the admin's above all, keep CSRF whatever headers they carry; every answer keeps
its security headers and request id; a deactivated agent is refused on its next request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from todos.models import Agent
from todos.tests.gunicorn_live import Server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # Tokens looked up afresh on every request, as the deactivation test needs from any process.
    live = Server(1, tmp_path_factory.mktemp("request-path"), {"API_TOKEN_CACHE_SECONDS": "0"})
    yield live
    live.stop()


def _staff_session() -> str:
    """The session cookie of a logged-in superuser (the session is in the test database)."""
    User.objects.create_superuser("root", "root@example.com", "pw-for-the-test")
    client = Client()
    assert client.login(username="root", password="pw-for-the-test")
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def _headers(token: str | None = None, cookie: str | None = None, **extra: str) -> dict[str, str]:
    headers = {name.replace("_", "-"): value for name, value in extra.items()}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if cookie is not None:
        headers["Cookie"] = cookie
    return headers


def _get(server: Server, path: str, **kwargs: Any) -> requests.Response:
    return requests.get(server.base + path, headers=_headers(**kwargs), timeout=30)


def _post(server: Server, path: str, body: Any, **kwargs: Any) -> requests.Response:
    return requests.post(server.base + path, json=body, headers=_headers(**kwargs), timeout=30)


def test_a_bad_bearer_token_beside_a_staff_session_is_refused_not_served_as_the_session(server: Server) -> None:
    cookie = _staff_session()
    # The session alone is served (the whole chain): staff may look.
    assert _get(server, "/api/v1/queues/", cookie=cookie).status_code == 200
    # A bearer header takes the lean chain: the token is the only credential, and this one is no agent's.
    for path in ("/api/v1/queues/", "/api/v1/todos/", "/api/v1/events/"):
        refused = _get(server, path, token="sk_not_a_token", cookie=cookie)
        assert refused.status_code == 401, (path, refused.text)
        assert refused.json()["error"]["code"] == "unauthorized"
        assert "Set-Cookie" not in refused.headers
    created = _post(server, "/api/v1/todos/", {"queue": "q", "title": "t"}, token="sk_not_a_token", cookie=cookie)
    assert created.status_code == 401, created.text


def test_a_valid_token_beside_a_staff_session_acts_as_the_agent_alone(server: Server, make_agent: Any) -> None:
    cookie = _staff_session()
    agent = make_agent("narrow", claim=["mine.*"])
    # The superuser's session may create anywhere; the token's agent only in its own scopes.
    made = _post(server, "/api/v1/todos/", {"queue": "other.q", "title": "t"}, token=agent.token, cookie=cookie)
    assert made.status_code == 400, made.text
    assert "not in this agent's create scopes" in made.json()["error"]["detail"]
    # And a claim (which a staff session may never make) is the agent's.
    claimed = _post(server, "/api/v1/todos/claim/", {"queues": ["mine.*"]}, token=agent.token, cookie=cookie)
    assert claimed.status_code == 200, claimed.text


def test_a_session_post_without_its_csrf_token_is_refused_whatever_bearer_header_rides_along(
    server: Server, make_agent: Any
) -> None:
    cookie = _staff_session()
    agent = make_agent("bystander")
    # The API, with the session only: DRF's session authentication enforces CSRF (the whole chain).
    api = _post(server, "/api/v1/todos/", {"queue": "q", "title": "t"}, cookie=cookie)
    assert api.status_code == 403, api.text
    # The admin is never on the lean chain: a bearer header does not take CSRF off its forms.
    for token in (agent.token, "sk_not_a_token"):
        admin = requests.post(
            server.base + "/admin/logout/",
            data={},
            headers=_headers(token=token, cookie=cookie),
            timeout=30,
            allow_redirects=False,
        )
        assert admin.status_code == 403, admin.text[:300]
        assert "CSRF" in admin.text


def test_answers_on_the_lean_chain_keep_their_security_headers_and_request_id(server: Server, make_agent: Any) -> None:
    agent = make_agent("headers", claim=["empty.*"])
    answers = {
        "plain": _get(server, "/api/v1/queues/", token=agent.token),
        "refused": _get(server, "/api/v1/queues/", token="sk_not_a_token"),
        "long-poll": _post(
            server, "/api/v1/todos/claim/", {"queues": ["empty.q"], "wait_seconds": 0.2}, token=agent.token
        ),
        "unknown path": _get(server, "/api/v1/nothing-here/", token=agent.token),
        "session-less 404": _get(server, "/api/v1/todos/td_missing/", token=agent.token),
    }
    statuses = {name: answer.status_code for name, answer in answers.items()}
    assert statuses == {"plain": 200, "refused": 401, "long-poll": 200, "unknown path": 404, "session-less 404": 404}
    for name, answer in answers.items():
        assert answer.headers["X-Frame-Options"] == "DENY", name
        assert answer.headers["X-Content-Type-Options"] == "nosniff", name
        assert answer.headers["Referrer-Policy"] == "same-origin", name
        assert len(answer.headers["X-Request-ID"]) >= 8, name
        assert answer.headers["Content-Type"].startswith("application/json"), name
        assert "Set-Cookie" not in answer.headers, name
    assert answers["long-poll"].json() == {"todos": []}


def test_a_deactivated_agent_is_refused_on_its_next_lean_request(server: Server, make_agent: Any) -> None:
    agent = make_agent("leaving")
    assert _get(server, "/api/v1/queues/", token=agent.token).status_code == 200
    Agent.objects.filter(pk=agent.pk).update(is_active=False)
    for path in ("/api/v1/queues/",):
        assert _get(server, path, token=agent.token).status_code == 401
    waited = _post(server, "/api/v1/todos/claim/", {"wait_seconds": 0.2}, token=agent.token)
    assert waited.status_code == 401, waited.text
