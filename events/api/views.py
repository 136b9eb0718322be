"""Event history: list, read, replay. Scope rule (docs/producers.md, "Events API and its scope rule"): an
agent sees an event if any route of the event's source targets a queue within its claim or create
scopes; staff see every event. Anything outside the caller's scope is 404, as if it did not exist."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from events import router as event_router
from events.api.serializers import EventListFilter, EventSerializer, EventSummarySerializer, ReplaySerializer
from events.models import Event, EventQuerySet
from switchboard import ids
from switchboard.api import CreatedCursorPagination
from todos.auth import caller_agent
from todos.models import Agent, Todo, TodoQuerySet

_ERROR = OpenApiResponse(description='`{"error": {"code", "detail"}}`')
_ERRORS = {401: _ERROR, 404: _ERROR, 503: _ERROR}


class EventCursorPagination(CreatedCursorPagination):
    ordering = ("-received_at", "-id")


def _staff_may(request: Request, permission: str) -> bool:
    """A staff session with this Django permission (the admin's own check); agents' requests are never staff."""
    user = request.user
    return bool(getattr(user, "is_staff", False)) and user.has_perm(permission)


def visible_events(request: Request) -> EventQuerySet:
    # Staff see every event with the permission the events admin asks (view), and none without it.
    if getattr(request.user, "is_staff", False):
        return Event.objects.all() if _staff_may(request, "events.view_event") else Event.objects.none()
    return Event.objects.visible_to(caller_agent(request))


def visible_todos(request: Request) -> TodoQuerySet:
    return Todo.objects.visible_to(caller_agent(request))


def _event_or_404(request: Request, pk: str) -> Event:
    event = visible_events(request).filter(pk=pk).first() if ids.is_id(pk, ids.EVENT) else None
    if event is None:
        raise NotFound(f"No event {pk[:40]!r}.")
    return event


@extend_schema(
    summary="List events",
    description="Events the caller may see (docs/producers.md: the events scope rule), newest first, without payloads.",
    parameters=[OpenApiParameter("source", str), OpenApiParameter("type", str)],
    responses={200: EventSummarySerializer(many=True), 400: _ERROR, 401: _ERROR, 503: _ERROR},
)
class EventList(generics.ListAPIView[Event]):
    serializer_class = EventSummarySerializer
    pagination_class = EventCursorPagination

    def get_queryset(self) -> EventQuerySet:
        filters = EventListFilter(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        events = visible_events(self.request)
        for field in ("source", "type"):
            if field in filters.validated_data:
                events = events.filter(**{field: filters.validated_data[field]})
        return events


class EventDetail(APIView):
    @extend_schema(summary="One event", responses={200: EventSerializer, **_ERRORS})
    def get(self, request: Request, pk: str) -> Response:
        event = _event_or_404(request, pk)
        return Response(EventSerializer(event, context={"visible_todos": visible_todos(request)}).data)


class EventReplay(APIView):
    """Re-run routing for a stored event: runnable todos are returned as they are, done and
    dead-lettered ones get a fresh todo. An agent replays only routes into its create scopes."""

    @extend_schema(summary="Replay an event's routing", request=None, responses={200: ReplaySerializer, **_ERRORS})
    def post(self, request: Request, pk: str) -> Response:
        # It takes no body; any field given is unknown (400 naming it), as on every API write. Only a
        # JSON body is read: an empty POST of any content type (curl -X POST) stays a plain replay.
        has_json = request.content_type.startswith("application/json") and request.body.strip()
        if has_json and isinstance(request.data, dict) and request.data:
            raise ValidationError({k: ["Unknown field; replay takes no body."] for k in sorted(request.data)})
        event = _event_or_404(request, pk)
        agent: Agent | None = caller_agent(request)
        if getattr(request.user, "is_staff", False):
            # The events admin's replay permission: staff replay every route as operators.
            if not request.user.has_perm("todos.change_todo"):
                raise PermissionDenied("Replay needs the todos.change_todo permission, as in the admin.")
            agent = None
        router = event_router.current()
        routed = router.replay(event, agent=agent) if router is not None else []
        body = ReplaySerializer(
            {
                "event_id": event.id,
                "todo_ids": [r.todo.id for r in routed],
                "created_todo_ids": [r.todo.id for r in routed if r.created],
            }
        ).data
        return Response(body)
