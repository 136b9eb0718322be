"""The one seam between stored events and the app that routes them into todos (ingest).

events/ knows only this protocol: ingest registers its router in its AppConfig.ready(), so events never
imports ingest, and an installation without a router has no replay and no event is in an agent's scope.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from events.models import Event
    from todos.models import Agent, Todo


class Routed(Protocol):
    """One todo a route points at, and whether this run made it."""

    @property
    def todo(self) -> Todo: ...

    @property
    def created(self) -> bool: ...


class EventRouter(Protocol):
    def replay(self, event: Event, *, agent: Agent | None = None) -> Sequence[Routed]:
        """Re-run the routes for a stored event (an agent: only those into its create scopes)."""
        ...

    def visible_sources(self, agent: Agent) -> QuerySet[Any, Any]:
        """The slugs of the sources with a route into the agent's claim or create scopes, as a subquery."""
        ...


_router: EventRouter | None = None


def register(router: EventRouter | None) -> None:
    # Process-wide by design: filled once, in the routing app's AppConfig.ready().
    global _router
    _router = router


def current() -> EventRouter | None:
    return _router
