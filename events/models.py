from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from events import router as event_router
from switchboard import ids

if TYPE_CHECKING:
    from todos.models import Agent


def new_event_id() -> str:
    return ids.new_id(ids.EVENT)


class EventQuerySet(models.QuerySet["Event"]):
    def visible_to(self, agent: Agent) -> EventQuerySet:
        """The scope rule: an agent sees an event if any route of its source (active or not, so history
        stays visible) targets a queue within the agent's claim or create scopes."""
        router = event_router.current()
        if router is None:
            return self.none()
        return self.filter(source__in=router.visible_sources(agent))


class Event(models.Model):
    """One verified webhook delivery. A redelivery (same source and delivery id) stores nothing new."""

    id = models.CharField(primary_key=True, max_length=40, default=new_event_id, editable=False)
    source = models.CharField(max_length=100, help_text="The slug of the source that delivered it.")
    type = models.CharField(max_length=200, help_text="e.g. pull_request.opened")
    delivery_id = models.CharField(max_length=200)
    payload = models.JSONField(default=dict)
    headers = models.JSONField(default=dict, help_text="Provider headers worth keeping; never signatures.")
    received_at = models.DateTimeField(db_default=Now())
    # For providers that sign only the body (GitHub): a capture resent with a fresh delivery id is known
    # by its body (ingest/intake.py). Null for the others.
    body_sha256 = models.CharField(max_length=64, null=True, blank=True, editable=False)

    objects = EventQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "delivery_id"], name="event_unique_delivery"),
        ]
        indexes = [
            # The events API and admin list newest first, optionally by source.
            models.Index(fields=["source", "-received_at"], name="event_source_recent"),
            models.Index(fields=["-received_at"], name="event_recent"),
            # The admin's type filter (newest first) and its choices (a skip scan of this index).
            models.Index(fields=["type", "-received_at"], name="event_type_recent"),
            # A replayed body (ingest/intake.py, FIND_SAME_BODY).
            models.Index(
                fields=["source", "body_sha256"], condition=Q(body_sha256__isnull=False), name="event_body_sha256"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.source} {self.type} {self.delivery_id}"
