from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from events.models import Event


class EventListFilter(serializers.Serializer[Any]):
    # DRF's CharField also refuses NUL characters, which PostgreSQL would refuse mid-query.
    # Named like Field.source: DRF's metaclass takes declared fields off the class, so nothing is
    # shadowed at run time (the stub cannot know).
    source = serializers.CharField(max_length=100, required=False, help_text="the source's slug")  # type: ignore[assignment]
    type = serializers.CharField(max_length=200, required=False, help_text="exact event type")


class EventSummarySerializer(serializers.ModelSerializer[Event]):
    """A list row: everything but the payload (payloads run to a megabyte; read one event for it)."""

    class Meta:
        model = Event
        fields: tuple[str, ...] = ("id", "source", "type", "delivery_id", "headers", "received_at")
        read_only_fields = fields


class EventTodoSerializer(serializers.Serializer[Any]):
    id = serializers.CharField()
    queue = serializers.CharField()
    kind = serializers.CharField()
    title = serializers.CharField()
    state = serializers.CharField()
    created_at = serializers.DateTimeField()


class EventSerializer(EventSummarySerializer):
    todos = serializers.SerializerMethodField()

    class Meta(EventSummarySerializer.Meta):
        fields = (*EventSummarySerializer.Meta.fields, "payload", "todos")
        read_only_fields = fields

    @extend_schema_field(EventTodoSerializer(many=True))
    def get_todos(self, event: Event) -> list[dict[str, Any]]:
        """The event's todos that the caller may see (a route can target queues outside its scopes)."""
        todos = self.context["visible_todos"].filter(event=event).order_by("created_at", "id")
        # many=True makes a ListSerializer, whose data is a list; the stub types the child's.
        data: list[dict[str, Any]] = EventTodoSerializer(todos, many=True).data  # type: ignore[assignment]
        return data


class ReplaySerializer(serializers.Serializer[Any]):
    event_id = serializers.CharField()
    todo_ids = serializers.ListField(child=serializers.CharField(), help_text="every todo the routes now point at")
    created_todo_ids = serializers.ListField(
        child=serializers.CharField(), help_text="the fresh ones (a done or dead-lettered todo's replacement)"
    )
