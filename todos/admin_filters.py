"""The todo changelist's filters. Each filter's choices come from a cheap query (the queue registry,
or a skip scan of the filter's own index), never a DISTINCT over the whole table, and each filter is
served by an index (todos/models.py, "The admin's changelist")."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet

from switchboard.admin_tools import distinct_values
from todos import states
from todos.models import Queue, Todo, TodoState


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [(s.value, s.label) for s in TodoState]

    def queryset(self, request: Any, queryset: QuerySet[Todo]) -> QuerySet[Todo]:
        if self.value() in TodoState.values:
            return queryset.filter(state=self.value())
        return queryset


class _YesNoFilter(admin.SimpleListFilter):
    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Yes"), ("no", "No")]

    def condition(self) -> Q:
        raise NotImplementedError

    def queryset(self, request: Any, queryset: QuerySet[Todo]) -> QuerySet[Todo]:
        if self.value() == "yes":
            return queryset.filter(self.condition())
        if self.value() == "no":
            return queryset.exclude(self.condition())
        return queryset


class DeadLetterFilter(_YesNoFilter):
    title = "dead-letter"
    parameter_name = "dead"

    def condition(self) -> Q:
        return states.DEAD_LETTER.q


class RetryWaitingFilter(_YesNoFilter):
    title = "retry-waiting"
    parameter_name = "retry_waiting"

    def condition(self) -> Q:
        return states.RETRY_WAITING.q


class LapsedFilter(_YesNoFilter):
    """Claims whose lease has run out: candidates for force-release (or for the reaper)."""

    title = "lease lapsed"
    parameter_name = "lapsed"

    def condition(self) -> Q:
        return states.LEASE_LAPSED.q


class _ValueFilter(admin.SimpleListFilter):
    column = ""
    limit = 100

    def choices_from_db(self) -> list[str]:
        return distinct_values("todos_todo", self.column, limit=self.limit)

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [(v, v) for v in self.choices_from_db()]

    def queryset(self, request: Any, queryset: QuerySet[Todo]) -> QuerySet[Todo]:
        if self.value():
            return queryset.filter(**{self.column: self.value()})
        return queryset


class QueueFilter(_ValueFilter):
    title = "queue"
    parameter_name = "queue"
    column = "queue"

    def choices_from_db(self) -> list[str]:
        # The registry of queue names is small and always complete (a trigger registers every todo's).
        return list(Queue.objects.order_by("name").values_list("name", flat=True)[: self.limit])


class KindFilter(_ValueFilter):
    title = "kind"
    parameter_name = "kind"
    column = "kind"


class SourceFilter(_ValueFilter):
    title = "source"
    parameter_name = "source"
    column = "source"


class AssigneeFilter(_ValueFilter):
    title = "assignee"
    parameter_name = "assignee"
    column = "assignee"


class FairKeyFilter(admin.SimpleListFilter):
    """Todos of one fair_key (?fair_key=K, a link from a todo's page). Only the key chosen is listed: a
    fair queue may have 10,000 keys, and no index serves a distinct scan of them across queues."""

    title = "fair key"
    parameter_name = "fair_key"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, value if len(value) <= 40 else value[:39] + "…")] if value else []

    def queryset(self, request: Any, queryset: QuerySet[Todo]) -> QuerySet[Todo]:
        return queryset.filter(fair_key=self.value()) if self.value() else queryset


class LastErrorFilter(admin.SimpleListFilter):
    """Todos whose last error (shortened as the triage groups shorten it) is exactly this one. Its
    choices are the groups the dead-letter list shows above the table (TodoAdmin.error_groups), so the
    sidebar lists only the one chosen: a GROUP BY per page load would be too dear at 1M rows."""

    title = "last error"
    parameter_name = "error"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, value if len(value) <= 40 else value[:39] + "…")] if value else []

    def queryset(self, request: Any, queryset: QuerySet[Todo]) -> QuerySet[Todo]:
        from todos.admin_display import last_error

        if self.value():
            narrowed: QuerySet[Todo] = queryset.annotate(sb_last_error=last_error()).filter(sb_last_error=self.value())
            return narrowed
        return queryset
