from __future__ import annotations

from typing import Any

from rest_framework import serializers

from events.models import Event


class EventSummarySerializer(serializers.ModelSerializer):
    """A list row: everything but the payload (payloads run to a megabyte; read one event for it)."""

    class Meta:
        model = Event
        fields = ("id", "source", "type", "delivery_id", "headers", "received_at")
        read_only_fields = fields


class EventSerializer(EventSummarySerializer):
    todos = serializers.SerializerMethodField()

    class Meta(EventSummarySerializer.Meta):
        fields = (*EventSummarySerializer.Meta.fields, "payload", "todos")
        read_only_fields = fields

    def get_todos(self, event: Event) -> list[dict[str, Any]]:
        """The event's todos that the caller may see (a route can target queues outside its scopes)."""
        todos = self.context["visible_todos"].filter(event=event).order_by("created_at", "id")
        return list(todos.values("id", "queue", "kind", "title", "state", "created_at"))


class ReplaySerializer(serializers.Serializer):
    event_id = serializers.CharField()
    todo_ids = serializers.ListField(child=serializers.CharField())
    created_todo_ids = serializers.ListField(child=serializers.CharField())
