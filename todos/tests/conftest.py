"""Fixtures for the API tests: a JSON client per agent token, and the long-poll listener's shutdown."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import Client

from todos.longpoll import listener
from todos.models import Agent
from todos.tests.gunicorn_live import start_server  # noqa: F401  (a fixture for the tests on the real server)
from todos.tests.outbound_receivers import receiver, smtp  # noqa: F401  (fixtures: an HTTP and an SMTP receiver)
from todos.tests.pgbouncer_support import pgbouncer  # noqa: F401  (a fixture: PgBouncer before the test database)

V1 = "/api/v1"


class Api:
    """The Django test client speaking JSON with a Bearer token (through the whole WSGI stack)."""

    def __init__(self, token: str | None) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.client = Client(headers=headers)

    def get(self, path: str, **params: Any) -> Any:
        return self.client.get(V1 + path, params)

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        data = body if isinstance(body, str | bytes) else json.dumps(body if body is not None else {})
        return self.client.post(V1 + path, data=data, content_type="application/json", **kw)


@pytest.fixture
def api_for() -> Callable[[Agent], Api]:
    return lambda agent: Api(agent.token)  # type: ignore[attr-defined]


@pytest.fixture
def api(agent: Agent, api_for: Callable[[Agent], Api]) -> Api:
    return api_for(agent)


@pytest.fixture(scope="session", autouse=True)
def _stop_listener(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    # The listener holds a connection to the test database; it must go before the database is dropped.
    yield
    listener.stop()
