"""Shared fixtures: agents, and a factory for todos in any state (rows are aged with the database's
clock instead of freezing time, as river's testfactory does)."""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.hashers import make_password
from django.db.models.functions import Now
from django.test import Client

from todos import queue
from todos.models import Agent, Todo, TodoState

if TYPE_CHECKING:
    from django.test.client import _MonkeyPatchedWSGIResponse  # django-stubs' type of a test response

_CREATE_ARGS = {
    "kind",
    "payload",
    "idempotency_key",
    "assignee",
    "max_attempts",
    "source",
    "run_at",
    "delay_seconds",
    "priority",
}


def _shape_defaults(state: str) -> dict[str, Any]:
    """What the database's shape constraints (todos/states.py, SHAPES) require of a state, for the
    columns a test does not set: a claim holds a live lease, a done todo has completed_at."""
    if state == TodoState.CLAIMED:
        return {
            "owner": "fixture",
            "lease_id": f"ls_{uuid.uuid4().hex}",
            "lease_expires_at": Now() + timedelta(minutes=5),
            "claimed_at": Now(),
        }
    if state in (TodoState.DONE, TodoState.CANCELLED):
        return {"completed_at": Now()}
    return {}


@pytest.fixture
def make_agent(db: None) -> Callable[..., Agent]:
    def make(name: str = "worker", claim: list[str] | None = None, create: list[str] | None = None, **kw: Any) -> Agent:
        agent = Agent(
            name=name,
            claim_scopes=claim if claim is not None else ["*"],
            create_scopes=create if create is not None else (claim if claim is not None else ["*"]),
            **kw,
        )
        agent.token = agent.set_new_token()  # type: ignore[attr-defined]
        agent.save()
        return agent

    return make


@pytest.fixture(autouse=True)
def _claims_ask_the_plain_statement_first() -> None:
    """Each test starts with no remembered fair scopes (todos/queue/claim.py): a queue fair in one test is plain
    in the next."""
    from todos.queue.claim import forget_keyed_scopes

    forget_keyed_scopes()


@pytest.fixture
def agent(make_agent: Callable[..., Agent]) -> Agent:
    return make_agent("alice")


@pytest.fixture
def make_todo(db: None) -> Callable[..., Todo]:
    def make(queue_name: str = "default", **overrides: Any) -> Todo:
        create_args = {k: overrides.pop(k) for k in list(overrides) if k in _CREATE_ARGS}
        todo, _ = queue.create(queue=queue_name, title=overrides.pop("title", "a todo"), **create_args)
        if "created_at" in overrides and "run_at" not in overrides and todo.state == "pending":
            # An unscheduled todo's run_at is its creation time: aging one ages the other.
            overrides["run_at"] = overrides["created_at"]
        if overrides:
            overrides = {**_shape_defaults(overrides.get("state", todo.state)), **overrides}
            Todo.objects.filter(pk=todo.pk).update(**overrides)
            todo.refresh_from_db()
        return todo

    return make


ADMIN_PASSWORD = "admin-password-1"  # noqa: S105  (the test operator's, known so a test may log in by form)


@functools.cache
def _admin_password_hash() -> str:
    # Hashed once per run: PBKDF2 at Django's cost is a large share of a small admin test.
    return make_password(ADMIN_PASSWORD)


@pytest.fixture
def admin_user(db: None, django_user_model: Any) -> Any:
    """pytest-django's "admin", made sure of: pytest-django takes any existing row of that name as it is
    (whatever an earlier test, thread or server committed), so here the row is written every time, an active
    superuser with a known password (ADMIN_PASSWORD)."""
    user, _ = django_user_model._default_manager.update_or_create(
        username="admin",
        defaults={
            "email": "admin@example.com",
            "password": _admin_password_hash(),
            "is_active": True,
            "is_staff": True,
            "is_superuser": True,
        },
    )
    return user


class AdminClient(Client):
    """The test client of admin_client, with the one check an admin page's assertions start from: the page
    answered 200. A 302 otherwise reads as an empty page; the message names where it pointed (the login: the
    session was not taken; the admin's index: the object was not found, e.g. an id not passed through
    django.contrib.admin.utils.quote, whose unquote reads td_22.. as 'td"..')."""

    def ok(self, path: str, data: Any = None, **extra: Any) -> _MonkeyPatchedWSGIResponse:
        """GET ``path``, asserting a 200."""
        response = self.get(path, data, **extra)
        assert response.status_code == 200, (path, response.status_code, response.get("Location"))
        return response

    def page(self, path: str, data: Any = None, **extra: Any) -> str:
        """GET ``path`` (asserting a 200) and return its text."""
        return self.ok(path, data, **extra).content.decode()


@pytest.fixture
def admin_client(db: None, admin_user: Any) -> AdminClient:
    client = AdminClient()
    client.force_login(admin_user)
    return client


def _optional_skips(config: pytest.Config) -> list[pytest.TestReport]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return list(reporter.stats.get("skipped", [])) if reporter is not None else []


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    # The tests that need Debian's chromium, redis-server, pgbouncer or the npm client skip where those are
    # missing; a newcomer's `make test` says so, and names the one command that installs them (issue 34).
    skipped = _optional_skips(config)
    if not skipped:
        return
    reasons = sorted({str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else "" for report in skipped})
    terminalreporter.section("optional tests skipped")
    terminalreporter.write_line(f"{len(skipped)} tests need parts this machine lacks:")
    for reason in reasons:
        terminalreporter.write_line(f"  - {reason.removeprefix('Skipped: ')}")
    terminalreporter.write_line("Install them (Debian, as root) and run again: make test-deps && make test")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # CI installs every optional part (.ci/run: make test-deps), so there a skip is missing work, not a choice.
    if os.environ.get("CI") and _optional_skips(session.config) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
