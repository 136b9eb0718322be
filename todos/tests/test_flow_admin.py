"""Parks in the admin (issue 31): a todo's page shows what blocks it; the limits list lifts a park."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.utils import timezone

from todos import queue
from todos.models import Agent, Limit

pytestmark = pytest.mark.django_db


def test_the_admin_shows_a_blocked_todo_and_lifts_the_park(admin_client: Any, agent: Agent) -> None:
    from django.urls import reverse

    todo, _ = queue.create(queue="jobs", limits=["openai"])
    [held] = queue.claim_next(agent=agent, queues=["jobs"])
    queue.park(
        held.id,
        agent=agent,
        lease_id=held.lease_id or "",
        limit="openai",
        until=timezone.now() + timedelta(hours=1),
        reason="429: resets 01:00",
    )
    answer = admin_client.get(reverse("admin:todos_todo_change", args=[quote(todo.id)]))
    assert answer.status_code == 200, (answer.status_code, answer.get("Location"))
    page = answer.content.decode()
    assert "blocked: openai parked until" in page and "429: resets 01:00" in page
    response = admin_client.post(
        reverse("admin:todos_limit_changelist"), {"action": "lift_parks", "_selected_action": ["openai"]}
    )
    assert response.status_code == 302
    assert Limit.objects.get(name="openai").parked_until is None
    assert [t.id for t in queue.claim_next(agent=agent, queues=["jobs"])] == [todo.id]
