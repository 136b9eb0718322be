"""A person's path through a real Chromium (issue 29): the signed link from their email opens the decision
page on a phone-sized screen, they edit the proposed arguments and approve, and the agent's todo is
pending with the edited decision. Then the inbox and the decision page at desktop size. Screenshots at both
sizes go to bench/out/screenshots/ (docs/img/ has copies, which docs/operators.md shows). The browser runs
on a thread of its own, as in test_admin_browser.py."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db.models.functions import Now

from todos import notices, queue
from todos.models import Todo, TodoState, Waitpoint
from todos.tests.outbound_receivers import smtp
from todos.tests.test_admin_browser import CHROMIUM, LAUNCH_ARGS, SCREENSHOTS
from todos.tests.test_people_waits import DAY, people

__all__ = ["smtp"]  # the fixture, imported for pytest

# As test_admin_browser.py: to bench/out/screenshots/ (git-ignored); those in docs/img/ were copied from there,
# so a test run leaves the tree clean.
IMG = SCREENSHOTS
PHONE = {"width": 390, "height": 844}  # an iPhone 12-15's CSS pixels
DESKTOP = {"width": 1280, "height": 860}

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)"
    ),
]


def in_browser(flow: Any) -> Any:
    from concurrent.futures import ThreadPoolExecutor

    def run() -> Any:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
            try:
                return flow(browser)
            finally:
                browser.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result(timeout=180)


def asked(make_agent: Any, make_todo: Any, **change: Any) -> Todo:
    agent = make_agent("mailer")
    todo = queue.claim(make_todo("outbox", title="Refund order 1042", payload={"order": 1042}).id, agent=agent)
    waiting, _ = queue.wait(
        todo.id, agent=agent, lease_id=todo.lease_id or "", wait_for=people(**change), timeout_seconds=DAY
    )
    return waiting


@pytest.fixture
def folks(transactional_db: None, settings: Any, live_server: Any) -> dict[str, Any]:
    settings.SESSION_COOKIE_SECURE = False
    settings.CSRF_COOKIE_SECURE = False
    settings.PUBLIC_URL = live_server.url
    finance = Group.objects.create(name="finance")
    erin = User.objects.create_user("erin", "erin@example.com", "pw-erin-123")
    erin.groups.add(finance)
    return {"dana": User.objects.create_user("dana", "dana@example.com", "pw-dana-123"), "erin": erin}


@pytest.mark.django_db(transaction=True)
def test_a_person_opens_the_link_on_a_phone_edits_and_approves(live_server, folks, make_agent, make_todo):
    IMG.mkdir(parents=True, exist_ok=True)
    todo = asked(make_agent, make_todo)
    mail = Todo.objects.get(queue=notices.NOTIFY_QUEUE, kind="notify.email", payload__to="dana@example.com")
    link = mail.payload["notice"]["links"]["decide"]
    assert link.startswith(live_server.url)

    def flow(browser: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        context = browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True)
        page = context.new_page()
        page.set_default_timeout(20_000)
        page.goto(link)
        page.click("#open-link")  # the link's page spends nothing until this button (mail scanners)
        page.wait_for_selector("button[value=approve]")
        seen["url"] = page.url
        seen["title"] = page.locator("h1").inner_text()
        seen["overflow"] = page.evaluate("document.documentElement.scrollWidth > window.innerWidth")
        seen["unlabelled"] = page.evaluate(
            """[...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
               .filter(e => !document.querySelector(`label[for="${e.id}"]`)).length"""
        )
        page.screenshot(path=str(IMG / "people-decide-phone.png"), full_page=True)
        page.fill("#f_amount", "100")
        page.select_option("#f_tone", "friendly")
        page.fill("#edit-text", "Capped at 100.")
        page.keyboard.press("Tab")
        page.click("button[value=edit]")
        page.wait_for_selector("text=Thank you")
        seen["done"] = page.locator("main").inner_text()
        # The link is spent: opening it again (a forwarded copy) opens nothing.
        other = browser.new_context(viewport=PHONE).new_page()
        other.goto(link)
        seen["again"] = other.locator("h1").inner_text()
        context.close()
        return seen

    seen = in_browser(flow)
    assert seen["url"] == f"{live_server.url}/decide/{todo.id}/"  # the token left the address bar
    assert seen["title"] == "Send the refund?"
    assert seen["overflow"] is False and seen["unlabelled"] == 0
    assert "Decided: edit" in seen["done"]
    assert seen["again"] == "This link no longer works"
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING
    assert todo.resolution["edited"] == {"to": "ada@example.com", "amount": 100, "urgent": False, "tone": "friendly"}
    assert todo.resolution["decided_by"] == "dana" and todo.resolution["text"] == "Capped at 100."


@pytest.mark.django_db(transaction=True)
def test_the_inbox_and_the_decision_page_at_desktop_size(live_server, folks, make_agent, make_todo):
    IMG.mkdir(parents=True, exist_ok=True)
    first = asked(make_agent, make_todo)
    make_agent_b = make_agent("reviewer")
    claimed = queue.claim(make_todo("reviews", title="Merge PR 88").id, agent=make_agent_b)
    queue.wait(
        claimed.id,
        agent=make_agent_b,
        lease_id=claimed.lease_id or "",
        wait_for=people(title="Merge PR 88 into main?", decisions=["approve", "reject", "respond"], edit_schema=None),
        timeout_seconds=DAY,
    )

    Waitpoint.objects.filter(pk=first.id).update(reminded_at=Now())  # its SLA state shows

    def flow(browser: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        page = browser.new_page(viewport=DESKTOP)
        page.set_default_timeout(20_000)
        page.goto(f"{live_server.url}/inbox/")
        page.fill("#id_username", "erin")
        page.fill("#id_password", "pw-erin-123")
        page.click("button[type=submit]")
        page.wait_for_selector("ol.inbox")
        seen["inbox"] = page.locator("ol.inbox").inner_text()
        page.screenshot(path=str(IMG / "people-inbox.png"), full_page=True)
        page.click("text=Send the refund?")
        page.wait_for_selector("button[value=approve]")
        page.screenshot(path=str(IMG / "people-decide-desktop.png"), full_page=True)
        page.set_viewport_size(PHONE)
        page.goto(f"{live_server.url}/inbox/")
        page.screenshot(path=str(IMG / "people-inbox-phone.png"), full_page=True)
        return seen

    seen = in_browser(flow)
    assert seen["inbox"].index("Send the refund?") < seen["inbox"].index("Merge PR 88 into main?")
    assert "mailer" in seen["inbox"] and "reviewer" in seen["inbox"] and "reminded" in seen["inbox"]
    assert Todo.objects.get(pk=first.id).state == TodoState.WAITING


@pytest.mark.django_db(transaction=True)
def test_end_to_end_the_sidecar_emails_the_link_and_the_browser_approves(
    live_server, folks, make_agent, make_todo, smtp, settings
):
    """The whole path: an agent asks, ``manage.py notify`` sends the email through Django's SMTP backend to
    a real SMTP server on loopback, and Chromium opens the link in that email and approves."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = smtp.host, smtp.port
    todo = asked(make_agent, make_todo, users=["dana"], groups=[])
    call_command("notify", once=True, stdout=io.StringIO())
    assert [m["To"] for m in smtp.messages] == ["dana@example.com"]
    message = smtp.messages[0]
    assert "Send the refund?" in message["Subject"]
    bodies = [part.get_payload(decode=True).decode() for part in message.walk() if not part.is_multipart()]
    links = {m for body in bodies for m in re.findall(r"https?://[^\s\"<>]+/decide/[^\s\"<>]+\?t=dl_[\w-]+", body)}
    assert len(links) == 1
    (link,) = links

    def flow(browser: Any) -> str:
        page = browser.new_context(viewport=PHONE, is_mobile=True).new_page()
        page.set_default_timeout(20_000)
        page.goto(link)
        page.click("#open-link")
        page.click("button[value=approve]")
        page.wait_for_selector("text=Thank you")
        return str(page.locator("main").inner_text())

    assert "Decided: approve" in in_browser(flow)
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING
    assert todo.resolution["by"] == "person" and todo.resolution["decided_by"] == "dana"
