"""The seam through which a wait asks whether its waiter may see an event source (issue 28).

todos/ cannot import ingest/ (docs/architecture.md, "Layers"): ingest registers its answer here in
``IngestConfig.ready()``, as it registers replay and the events' scope rule with events/router.py. The
rule is the one GET /api/v1/events/ applies: a source is visible to an agent when a route of it (active or
not) targets a queue in the agent's claim or create scopes. With nothing registered (no ingest app) no
source is visible, so an event wait is refused as naming an unknown source.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from todos.models import Agent


class EventSources(Protocol):
    def visible_to(self, agent: Agent, slug: str) -> bool:
        """Whether a source of this slug exists and a route of it reaches the agent's scopes."""
        ...


_sources: EventSources | None = None


def register(sources: EventSources | None) -> None:
    # Process-wide by design: filled once, in the routing app's AppConfig.ready().
    global _sources
    _sources = sources


def visible_to(agent: Agent, slug: str) -> bool:
    return _sources is not None and _sources.visible_to(agent, slug)
