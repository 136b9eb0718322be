"""The queue dashboard: per-queue counts, oldest pending age, per-minute completions and failures."""

from __future__ import annotations

import re
from datetime import timedelta

from django.db.models.functions import Now
from django.urls import reverse

from todos.models import TodoState


def _seed(make_todo):
    make_todo("alpha", created_at=Now() - timedelta(minutes=30))
    make_todo("alpha")
    make_todo("alpha", state=TodoState.CLAIMED, lease_expires_at=Now() + timedelta(minutes=5))
    make_todo("alpha", state=TodoState.FAILED, attempt=1, next_retry_at=Now() + timedelta(minutes=5))
    make_todo("beta", state=TodoState.FAILED, attempt=5, next_retry_at=None, updated_at=Now() - timedelta(minutes=2))
    make_todo("beta", state=TodoState.DONE, completed_at=Now() - timedelta(minutes=2))
    make_todo("beta", state=TodoState.DONE, completed_at=Now() - timedelta(minutes=2))
    make_todo("beta", state=TodoState.DONE, completed_at=Now() - timedelta(hours=2))  # outside the hour
    make_todo("beta", delay_seconds=600)


def test_dashboard_json_counts_per_queue(admin_client, make_todo, django_assert_max_num_queries):
    _seed(make_todo)
    with django_assert_max_num_queries(8):  # 6, then issue 30: the orphan count and the last hour's usage
        data = admin_client.ok(reverse("admin-dashboard-json")).json()
    queues = {q["name"]: q for q in data["queues"]}
    alpha, beta = queues["alpha"], queues["beta"]
    assert (alpha["pending"], alpha["claimed"], alpha["retry_waiting"], alpha["dead_letters"]) == (2, 1, 1, 0)
    assert (beta["pending"], beta["dead_letters"], beta["scheduled"], alpha["scheduled"]) == (0, 1, 1, 0)
    assert 29 * 60 < alpha["oldest_pending_seconds"] < 32 * 60
    assert beta["oldest_pending_seconds"] is None
    assert sum(beta["done_per_minute"]) == 2 and len(beta["done_per_minute"]) == 60
    assert beta["done_per_minute"][-3] + beta["done_per_minute"][-2] == 2  # two minutes ago, give or take a tick
    assert sum(beta["failed_per_minute"]) == 1 and sum(alpha["failed_per_minute"]) == 1


def test_dashboard_page_renders_counts_chart_and_refreshes(admin_client, make_todo):
    _seed(make_todo)
    body = admin_client.page(reverse("admin-dashboard"))
    assert '<meta http-equiv="refresh" content="10">' in body
    assert '<svg class="sb-chart"' in body and 'class="sb-done"' in body
    assert "?queue=beta&amp;dead=yes" in body  # the dead-letters link straight to triage
    assert re.search(r"<td>(29|30)\xa0minutes</td>", body)  # the oldest pending age


def test_dashboard_with_no_queues_says_so(admin_client):
    assert b"No queues yet" in admin_client.ok(reverse("admin-dashboard")).content


def test_admin_index_links_the_dashboard(admin_client):
    assert reverse("admin-dashboard").encode() in admin_client.ok(reverse("admin:index")).content
