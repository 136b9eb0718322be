"""Events in the admin: a read-only record of deliveries, filterable by source and type, with the
todos each one made and a replay action (re-run routing; runnable todos are not duplicated)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import lookup_field, quote
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from events import router as event_router
from events.models import Event
from switchboard import ids
from switchboard.admin_tools import EstimatedCountPaginator, distinct_values
from todos.models import Todo

MAX_TODOS_SHOWN = 100


class _IndexedValueFilter(admin.SimpleListFilter):
    column = ""

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        # A skip scan of the column's (column, received_at) index: no DISTINCT over every event.
        return [(v, v) for v in distinct_values("events_event", self.column, limit=100)]

    def queryset(self, request: Any, queryset: QuerySet[Event]) -> QuerySet[Event]:
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
class EventAdmin(admin.ModelAdmin[Event]):
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

    def get_queryset(self, request: HttpRequest) -> QuerySet[Event]:
        qs = super().get_queryset(request)
        match = request.resolver_match
        if match is None or match.url_name != "events_event_change":
            qs = qs.defer("payload", "headers")
        return qs

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        if event_router.current() is None:  # an installation without a router (ingest): nothing to replay
            actions.pop("replay", None)
        return actions

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Event], search_term: str
    ) -> tuple[QuerySet[Event], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if ids.is_id(term, ids.EVENT):
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
        # The todos admin renders each todo's state badge; asked through the admin site's registry, so
        # this app never imports the todos admin.
        todo_admin = self.admin_site.get_model_admin(Todo)
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
                (
                    reverse("admin:todos_todo_change", args=[quote(t.pk)]),
                    t.pk,
                    t.queue,
                    t.kind,
                    t.title,
                    lookup_field("state_badge", t, todo_admin)[2],
                )
                for t in todos[:MAX_TODOS_SHOWN]
            ),
        )
        more = format_html(
            '<p><a href="{}?q={}">all todos of this event</a></p>', reverse("admin:todos_todo_changelist"), obj.pk
        )
        return format_html("<ul>{}</ul>{}", items, more)

    @admin.action(description="Replay: re-run routing (runnable todos are not duplicated)", permissions=["replay"])
    def replay(self, request: HttpRequest, queryset: QuerySet[Event]) -> None:
        router = event_router.current()
        if router is None:
            self.message_user(request, "Replay is not available in this installation.", messages.ERROR)
            return
        events = list(queryset[:MAX_TODOS_SHOWN])
        replayed = created = existing = 0
        failures = []
        for event in events:
            try:
                routed = router.replay(event)
            except Exception as exc:  # e.g. RoutingFailed: report it and go on with the other events
                failures.append(f"{event.pk}: {exc}")
                continue
            replayed += 1
            new = sum(1 for r in routed if r.created)
            created += new
            existing += len(routed) - new
            self.log_change(request, event, f"Replayed: {new} new todo(s), {len(routed) - new} already there")
        self.message_user(
            request, f"{replayed} event(s) replayed: {created} new todo(s), {existing} already there (not duplicated)."
        )
        if failures:
            self.message_user(request, "Not replayed: " + "; ".join(failures), messages.ERROR)
