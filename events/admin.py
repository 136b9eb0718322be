"""Events in the admin: a read-only record of deliveries, filterable by source and type, with the
todos each one made and a replay action (re-run routing; runnable todos are not duplicated)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from events.models import Event
from switchboard.admin_tools import EstimatedCountPaginator, distinct_values

EVENT_ID_RE = re.compile(r"^ev_[0-9a-f]{1,32}$")
MAX_TODOS_SHOWN = 100


def replay_function() -> Callable[[Event], Any] | None:
    """ingest.routing.replay; the action is hidden in an installation without it."""
    try:
        from ingest.routing import replay  # type: ignore[attr-defined]
    except ImportError:
        return None
    return replay  # type: ignore[no-any-return]


class _IndexedValueFilter(admin.SimpleListFilter):
    column = ""

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        # A skip scan of the column's (column, received_at) index: no DISTINCT over every event.
        return [(v, v) for v in distinct_values("events_event", self.column, limit=100)]

    def queryset(self, request: Any, queryset: QuerySet) -> QuerySet:
        return queryset.filter(**{self.column: self.value()}) if self.value() else queryset


class SourceFilter(_IndexedValueFilter):
    title = "source"
    parameter_name = "source"
    column = "source"


class TypeFilter(_IndexedValueFilter):
    title = "type"
    parameter_name = "type"
    column = "type"


def _pretty(value: Any) -> SafeString:
    return format_html('<pre class="sb-json">{}</pre>', json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ("id", "source", "type", "delivery_id", "received_at")
    list_filter = (SourceFilter, TypeFilter)
    search_fields = ("id", "delivery_id")
    search_help_text = "An ev_… id or a provider's delivery id, exactly."
    ordering = ("-received_at",)
    sortable_by = ("received_at",)
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts are a COUNT per filter choice: too dear here
    list_per_page = 50
    fields = ("id", "source", "type", "delivery_id", "received_at", "todos_list", "payload_json", "headers_json")
    readonly_fields = fields
    actions = ["replay"]

    class Media:
        css = {"all": ["todos/admin.css"]}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # events arrive through /ingest/<source>/ only

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a record of what was delivered

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # retention's job (manage.py purge)

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("todos.change_todo")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        match = request.resolver_match
        if match is None or match.url_name != "events_event_change":
            qs = qs.defer("payload", "headers")
        return qs

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        if replay_function() is None:
            actions.pop("replay", None)
        return actions

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if EVENT_ID_RE.match(term):
            return queryset.filter(pk=term), False
        return queryset.filter(delivery_id=term), False

    @admin.display(description="payload")
    def payload_json(self, obj: Event) -> SafeString:
        return _pretty(obj.payload)

    @admin.display(description="headers")
    def headers_json(self, obj: Event) -> SafeString:
        return _pretty(obj.headers)

    @admin.display(description="todos")
    def todos_list(self, obj: Event) -> SafeString | str:
        from todos.admin_display import state_badge

        todos = list(
            obj.todos.only("id", "queue", "kind", "title", "state", "next_retry_at").order_by("created_at")[
                : MAX_TODOS_SHOWN + 1
            ]
        )
        if not todos:
            return "none"
        items = format_html_join(
            "",
            '<li><a href="{}">{}</a> {} {} “{}” {}</li>',
            (
                (reverse("admin:todos_todo_change", args=[quote(t.pk)]), t.pk, t.queue, t.kind, t.title, state_badge(t))
                for t in todos[:MAX_TODOS_SHOWN]
            ),
        )
        more = format_html(
            '<p><a href="{}?q={}">all todos of this event</a></p>', reverse("admin:todos_todo_changelist"), obj.pk
        )
        return format_html("<ul>{}</ul>{}", items, more)

    @admin.action(description="Replay: re-run routing (runnable todos are not duplicated)", permissions=["replay"])
    def replay(self, request: HttpRequest, queryset: QuerySet) -> None:
        replay = replay_function()
        if replay is None:
            self.message_user(request, "Replay is not available in this installation.", messages.ERROR)
            return
        events = list(queryset[:MAX_TODOS_SHOWN])
        replayed = created = existing = 0
        failures = []
        for event in events:
            try:
                routed = replay(event) or []
            except Exception as exc:  # e.g. RoutingFailed: report it and go on with the other events
                failures.append(f"{event.pk}: {exc}")
                continue
            replayed += 1
            new = sum(1 for r in routed if getattr(r, "created", False))
            created += new
            existing += len(routed) - new
            self.log_change(request, event, f"Replayed: {new} new todo(s), {len(routed) - new} already there")
        self.message_user(
            request, f"{replayed} event(s) replayed: {created} new todo(s), {existing} already there (not duplicated)."
        )
        if failures:
            self.message_user(request, "Not replayed: " + "; ".join(failures), messages.ERROR)
