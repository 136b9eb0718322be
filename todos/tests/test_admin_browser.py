"""The operator's path through a real Chromium: log in, filter the dead-letters, retry two, see them
pending, open the dashboard. Screenshots go to bench/out/screenshots/ (git-ignored; those in docs/img/
come from there).

Playwright's sync API runs an event loop in its thread, and Django refuses database work in a thread
with a running loop; so the browser is driven from a worker thread of its own, while the test's
thread sets up rows and checks them in the database. The browser never shares a thread with the ORM,
so DJANGO_ALLOW_ASYNC_UNSAFE is not needed.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import User
from django.db.models.functions import Now
from django.urls import reverse

from todos.models import Todo, TodoState

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "bench" / "out" / "screenshots"
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)"
    ),
]


def in_browser(flow: Callable[[Any], Any]) -> Any:
    """Run ``flow(page)`` in a fresh Chromium, on a thread of its own (see the module docstring)."""

    def run() -> Any:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1366, "height": 900})
                page.set_default_timeout(20_000)
                return flow(page)
            finally:
                browser.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result(timeout=180)


@pytest.fixture
def operator(transactional_db, settings):
    # The live server speaks plain http: let the session and CSRF cookies travel over it.
    settings.SESSION_COOKIE_SECURE = False
    settings.CSRF_COOKIE_SECURE = False
    User.objects.create_superuser("ops", "ops@example.com", "ops-password-1")
    return ("ops", "ops-password-1")


def _login(page: Any, base: str, credentials: tuple[str, str]) -> None:
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", credentials[0])
    page.fill("#id_password", credentials[1])
    page.click("input[type=submit]")
    page.wait_for_selector("#sb-operations")


def _dead(make_todo, title: str) -> Todo:
    todo = make_todo("github.reviews", title=title, kind="review", payload={"pr": 7})
    Todo.objects.filter(pk=todo.pk).update(
        state=TodoState.FAILED,
        attempt=5,
        errors=[{"attempt": 5, "at": "2026-01-01T00:00:00+00:00", "error": "model timed out"}],
    )
    return todo


@pytest.mark.django_db(transaction=True)
def test_operator_retries_two_dead_letters_and_opens_the_dashboard(live_server, operator, make_todo):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    dead = [_dead(make_todo, f"Review PR #{n}") for n in (101, 102, 103)]
    make_todo("github.reviews", title="Review PR #104")
    make_todo("deploys", title="Deploy main")
    # some history for the dashboard's chart: completions and a failure spread over the last hour
    for minute in range(0, 60, 3):
        for _ in range(1 + minute % 4):
            make_todo("deploys", state=TodoState.DONE, completed_at=Now() - timedelta(minutes=minute))
    make_todo(
        "deploys",
        state=TodoState.FAILED,
        attempt=1,
        next_retry_at=Now() + timedelta(minutes=9),
        updated_at=Now() - timedelta(minutes=20),
    )
    chosen = [dead[0].id, dead[1].id]

    def flow(page: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        _login(page, live_server.url, operator)
        page.click("text=Dead-letters")  # from the index's Operations box
        page.wait_for_selector("#result_list")
        seen["dead_rows"] = page.locator("#result_list tbody tr").count()
        seen["badges"] = page.locator(".sb-state-dead-letter").count()
        page.screenshot(path=str(SCREENSHOTS / "dead-letters.png"), full_page=True)

        for todo_id in chosen:
            page.check(f"input[name=_selected_action][value='{todo_id}']")
        page.select_option("select[name=action]", "retry_reset")
        page.click("button[name=index]")
        page.fill("#id_note", "model endpoint back up")
        page.click("input[name=confirm]")
        seen["message"] = page.locator("ul.messagelist li").first.inner_text()

        page.goto(f"{live_server.url}/admin/todos/todo/?state=pending&queue=github.reviews")
        seen["pending_page"] = page.content()
        page.emulate_media(color_scheme="dark")
        page.screenshot(path=str(SCREENSHOTS / "pending-after-retry-dark.png"), full_page=True)
        page.emulate_media(color_scheme="light")

        page.goto(live_server.url + reverse("admin:todos_todo_change", args=[quote(chosen[0])]))
        seen["detail"] = page.locator(".sb-timeline").inner_text()
        page.screenshot(path=str(SCREENSHOTS / "todo-detail.png"), full_page=True)

        page.goto(f"{live_server.url}/admin/")
        page.click("text=Queue dashboard")
        page.wait_for_selector("#sb-queues")
        seen["dashboard"] = page.locator("#sb-queues").inner_text()
        page.screenshot(path=str(SCREENSHOTS / "dashboard.png"), full_page=True)
        page.emulate_media(color_scheme="dark")
        page.screenshot(path=str(SCREENSHOTS / "dashboard-dark.png"), full_page=True)
        page.set_viewport_size({"width": 1024, "height": 768})  # a small laptop
        seen["narrow_overflow"] = page.evaluate("document.documentElement.scrollWidth > window.innerWidth + 1")
        return seen

    seen = in_browser(flow)

    assert seen["dead_rows"] == 3 and seen["badges"] == 3
    assert seen["message"] == "2 retried."
    for todo_id in chosen:
        assert todo_id in seen["pending_page"]
        todo = Todo.objects.get(pk=todo_id)
        assert todo.state == TodoState.PENDING and todo.attempt == 0
        assert todo.errors[-1]["note"] == "model endpoint back up" and todo.errors[-1]["operator"] == "ops"
    assert Todo.objects.get(pk=dead[2].id).is_dead_letter
    assert "github.reviews" in seen["dashboard"] and "deploys" in seen["dashboard"]
    assert not seen["narrow_overflow"]
    assert "operator retry" in seen["detail"] and "model endpoint back up" in seen["detail"]


@pytest.mark.django_db(transaction=True)
def test_operator_retries_every_matching_dead_letter_in_batches(live_server, operator, make_todo, monkeypatch):
    from todos.admin import TodoAdmin

    dead = [_dead(make_todo, f"Review PR #{n}") for n in range(7)]
    elsewhere = make_todo("deploys", title="Deploy main")
    Todo.objects.filter(pk=elsewhere.pk).update(state=TodoState.FAILED, attempt=5)
    # Small batches and a small per-request cap, so the run takes several auto-continued requests.
    monkeypatch.setattr(TodoAdmin, "bulk_batch_size", 2)
    monkeypatch.setattr(TodoAdmin, "bulk_request_cap", 2)

    def flow(page: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        _login(page, live_server.url, operator)
        page.goto(f"{live_server.url}/admin/todos/todo/?dead=yes&queue=github.reviews")
        page.click("#sb-bulk summary")
        page.click("#sb-bulk a:has-text('Retry once')")
        seen["confirm"] = page.locator("#content").inner_text()
        page.fill("#id_note", "replaying after the outage")
        page.click("input[type=submit][value^='Start']")
        page.wait_for_selector("ul.messagelist li", timeout=60_000)  # after the last auto-continue
        seen["message"] = page.locator("ul.messagelist li").first.inner_text()
        seen["url"] = page.url
        return seen

    seen = in_browser(flow)

    assert "That is 7 todos now" in seen["confirm"]
    assert seen["message"] == "Every matching todo: 7 retried."
    assert seen["url"].endswith("/admin/todos/todo/?dead=yes&queue=github.reviews")
    for todo in dead:
        todo.refresh_from_db()
        assert todo.state == TodoState.PENDING and todo.max_attempts == 6
        assert todo.errors[-1]["note"] == "replaying after the outage"
    elsewhere.refresh_from_db()
    assert elsewhere.is_dead_letter


@pytest.mark.django_db(transaction=True)
def test_triage_at_1280_px_fits_and_retries_a_whole_error_group(live_server, operator, make_todo):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    errors = ["model timed out"] * 4 + ["KeyError 'pr'"] * 2 + ["RateLimitError: 429 Too Many Requests from upstream"]
    dead = []
    for n, error in enumerate(errors):
        todo = _dead(make_todo, f"Review PR #{200 + n}: tighten the retry budget of the webhook receiver")
        Todo.objects.filter(pk=todo.pk).update(
            errors=[{"attempt": 5, "at": "2026-01-01T00:00:00+00:00", "error": error}],
            assignee="reviewer-bot" if n % 3 == 0 else None,
            owner="reviewer-bot/host-1",
            created_at=Now() - timedelta(days=3, hours=n),
        )
        dead.append(todo)

    def flow(page: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        page.set_viewport_size({"width": 1280, "height": 800})
        _login(page, live_server.url, operator)
        page.goto(f"{live_server.url}/admin/todos/todo/?dead=yes")
        page.wait_for_selector("#sb-triage")
        seen["groups"] = page.locator("#sb-triage").inner_text()
        seen["overflow"] = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        seen["table_right"] = page.evaluate("document.querySelector('#result_list').getBoundingClientRect().right")
        seen["box_right"] = page.evaluate(
            "document.querySelector('#changelist .results').getBoundingClientRect().right"
        )
        heights = page.evaluate(
            "[...document.querySelectorAll('#result_list tbody tr')].map(r => r.getBoundingClientRect().height)"
        )
        seen["row_heights"] = heights
        page.screenshot(path=str(SCREENSHOTS / "triage.png"), full_page=True)
        page.click("#sb-triage tr:has-text('model timed out') a:has-text('Retry once')")
        page.fill("#id_note", "model endpoint back up")
        page.click("input[type=submit][value^='Start']")
        page.wait_for_selector("ul.messagelist li", timeout=60_000)
        seen["message"] = page.locator("ul.messagelist li").first.inner_text()
        return seen

    seen = in_browser(flow)

    assert "model timed out" in seen["groups"] and "Retry once" in seen["groups"], seen["groups"]
    # Nothing scrolls sideways: not the page, and not the table inside its box.
    assert seen["overflow"] <= 0 and seen["table_right"] <= seen["box_right"] + 1, seen
    assert max(seen["row_heights"]) < 1.5 * min(seen["row_heights"]), seen["row_heights"]  # no cell wraps
    assert seen["message"] == "Every matching todo: 4 retried."
    assert Todo.objects.dead_lettered().count() == 3
