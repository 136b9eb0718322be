"""What a wait for people tells them (issue 29), through todos/notices.py: asked, reminded, escalated and
reassigned. Each runs in its caller's transaction (the wait, the reaper's sweep, the reassignment), so a
notice is enqueued exactly when the change it tells of commits. Each emailed person gets their own signed
link (todos/people/links.py); webhooks get the page's address, which asks for a login."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.contrib.auth.models import Group, User

from todos import notices
from todos.people import links

_EVENTS = {
    "asked": ("wait.asked", "Decision needed"),
    "reminded": ("wait.reminder", "Reminder: decision needed"),
    "escalated": ("wait.escalated", "Escalated: decision needed"),
    "reassigned": ("wait.reassigned", "Decision needed"),
}


def tell(
    what: str,
    *,
    todo_id: str,
    wait_created_at: datetime,
    timeout_at: datetime,
    people: dict[str, Any],
    user_ids: Iterable[int],
    group_ids: Iterable[int],
    key_suffix: str = "",
) -> list[str]:
    """Enqueue the notice ``what`` (asked, reminded, escalated, reassigned) of one people wait to these
    users and groups' members; returns the delivery todos' ids."""
    event, lead = _EVENTS[what]
    title = str(people.get("title", ""))
    notice = notices.Notice(
        key=f"wait:{todo_id}:{what}{key_suffix}",
        event=event,
        subject=f"{lead}: {title}",
        text=f"{title}\n\n{people.get('body', '')}".strip(),
        links={"open": links.page_url(todo_id), "inbox": links.inbox_url()},
        data={
            "todo": todo_id,
            "title": title,
            "decisions": people.get("decisions", []),
            "timeout_at": timeout_at.isoformat(),
        },
    )

    def links_for(user: Any) -> dict[str, str]:
        signed = links.issue(todo_id=todo_id, wait_created_at=wait_created_at, timeout_at=timeout_at, user=user)
        return {"decide": signed, "inbox": links.inbox_url()}

    users = list(User.objects.filter(pk__in=list(user_ids), is_active=True))
    groups = list(Group.objects.filter(pk__in=list(group_ids)))
    return notices.notify_users(users=users, groups=groups, notice=notice, links_for=links_for)
