"""Event history: list, read, replay. Scope rule (README "Webhooks"): an agent sees an event if any
route of the event's source targets a queue within its claim or create scopes; staff see every event.
Anything outside the caller's scope is 404, as if it did not exist."""

from __future__ import annotations

from django.db import transaction
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from events.api.serializers import EventSerializer, EventSummarySerializer, ReplaySerializer
from events.models import Event, EventQuerySet
from ingest import routing
from switchboard.api import CreatedCursorPagination, caller_agent
from todos.models import Todo, TodoQuerySet


class EventCursorPagination(CreatedCursorPagination):
    ordering = ("-received_at", "-id")


def _is_staff(request: Request) -> bool:
    return bool(getattr(request.user, "is_staff", False))


def visible_events(request: Request) -> EventQuerySet:
    if _is_staff(request):
        return Event.objects.all()
    return Event.objects.visible_to(caller_agent(request))


def visible_todos(request: Request) -> TodoQuerySet:
    if _is_staff(request):
        return Todo.objects.all()
    return Todo.objects.visible_to(caller_agent(request))


class EventList(generics.ListAPIView):
    serializer_class = EventSummarySerializer
    pagination_class = EventCursorPagination

    def get_queryset(self) -> EventQuerySet:
        events = visible_events(self.request)
        if source := self.request.query_params.get("source"):
            events = events.filter(source=source)
        if event_type := self.request.query_params.get("type"):
            events = events.filter(type=event_type)
        return events


class EventDetail(generics.RetrieveAPIView):
    serializer_class = EventSerializer

    def get_queryset(self) -> EventQuerySet:
        return visible_events(self.request)

    def get_serializer_context(self) -> dict[str, object]:
        return {**super().get_serializer_context(), "visible_todos": visible_todos(self.request)}


class EventReplay(APIView):
    """Re-run routing for a stored event: runnable todos are returned as they are, done and
    dead-lettered ones get a fresh todo. An agent replays only routes into its create scopes."""

    def post(self, request: Request, pk: str) -> Response:
        event = generics.get_object_or_404(visible_events(request), pk=pk)
        agent = None if _is_staff(request) else caller_agent(request)
        with transaction.atomic():
            routed = routing.replay(event, agent=agent)
        body = ReplaySerializer(
            {
                "event_id": event.id,
                "todo_ids": [r.todo.id for r in routed],
                "created_todo_ids": [r.todo.id for r in routed if r.created],
            }
        ).data
        return Response(body)
