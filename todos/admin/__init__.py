"""The operator console for todos, agents and queue names.

Operators never edit a todo: its fields are read-only and every change goes through an action that
calls todos/queue/ (todos/admin/ops.py). The changelist stays fast on millions of rows: no full
COUNT(*) (switchboard/admin_tools.py), an index behind every filter (todos/admin/filters.py), heavy
JSON columns deferred, sorting only on what an index orders.
"""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets, quote, unquote
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.utils.safestring import SafeString

from switchboard import ids
from switchboard.admin_tools import EstimatedCountPaginator, staff_user_id
from todos import controls, flow, selectors, states
from todos.admin import display as show
from todos.admin.bulk import bulk_view
from todos.admin.filters import (
    AssigneeFilter,
    DeadLetterFilter,
    FairKeyFilter,
    KindFilter,
    LapsedFilter,
    LastErrorFilter,
    QueueFilter,
    RetryWaitingFilter,
    SourceFilter,
    StateFilter,
)
from todos.admin.login import ThrottledAdminLoginForm
from todos.admin.ops import OPS, Op, apply
from todos.auth import notify_agents_changed
from todos.errors import InvalidTransitionInput
from todos.limits import MAX_SELECTED, MAX_TREE_CHILDREN_SHOWN
from todos.models import (
    SYSTEM_QUEUES,
    Agent,
    Limit,
    NotifyEndpoint,
    Queue,
    Schedule,
    Todo,
    TodoState,
    Waitpoint,
    new_webhook_secret,
)
from todos.people.links import decide_path
from todos.schedules import next_tick

# A changelist page holds at most list_per_page rows; this bounds a hand-made POST all the same.


def _operator_action(op: Op) -> Any:
    def action(modeladmin: TodoAdmin, request: HttpRequest, queryset: QuerySet[Todo]) -> HttpResponse | None:
        return modeladmin.run_op(request, queryset, op)

    action.__name__ = op.name
    return admin.action(description=op.label, permissions=["operate"])(action)


def _shortened(text: str, limit: int) -> SafeString:
    """Cut to ``limit`` characters with an ellipsis, the whole text in the tooltip."""
    short = text if len(text) <= limit else text[: limit - 1] + "…"
    return format_html('<span title="{}">{}</span>', text, short)


def ops_for(todo: Todo) -> list[Op]:
    """The actions whose guard this todo passes now (the detail page offers only those)."""
    label = states.label(todo)
    names = {
        "dead-letter": ["retry_reset", "retry_once", "discard"],
        "retry-waiting": ["retry_now", "discard", "cancel", "cancel_tree"],
        "pending": ["set_priority", "discard", "cancel", "cancel_tree"],
        "scheduled": ["run_now", "set_priority", "discard", "cancel", "cancel_tree"],
        "claimed": ["force_release", "cancel", "cancel_tree"],
        "waiting": ["approve", "reject", "cancel", "cancel_tree"],
    }.get(label, [])
    return [OPS[name] for name in names]


@admin.register(Todo)
class TodoAdmin(admin.ModelAdmin[Todo]):
    # Fits 1280 px beside the filter panel (a browser test measures it): long text is cut with the
    # whole in the tooltip; kind and assignee are filters and on the detail page, not columns.
    list_display = (
        "short_id",
        "short_queue",
        "short_title",
        "state_badge",
        "attempts",
        "last_error",
        "short_owner",
        "due",
        "age",
    )
    list_display_links = ("short_id",)
    list_filter = (
        StateFilter,
        DeadLetterFilter,
        LastErrorFilter,
        RetryWaitingFilter,
        LapsedFilter,
        QueueFilter,
        KindFilter,
        AssigneeFilter,
        SourceFilter,
        FairKeyFilter,
    )
    search_fields = ("id", "title", "idempotency_key", "owner")
    search_help_text = (
        "A td_… id (or an ev_… event id) finds exactly that; key:K an idempotency key, owner:NAME a last "
        "claimer; other text matches titles containing it."
    )
    ordering = ("-created_at",)
    sortable_by = ("age",)  # the one order an index serves with every filter
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts are a COUNT per filter choice: too dear here
    list_per_page = 50
    actions = [_operator_action(op) for op in OPS.values()]
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "state_badge",
                    "queue",
                    "kind",
                    "title",
                    "source",
                    "assignee",
                    "idempotency_key",
                    "fair_key",
                    "limits_blocked",
                )
            },
        ),
        (
            "Attempts and lease",
            {
                "fields": (
                    "attempts",
                    "priority",
                    "run_at",
                    "owner",
                    "lease_expires_at",
                    "next_retry_at",
                    "claimed_at",
                    "completed_at",
                    "created_at",
                    "updated_at",
                )
            },
        ),
        ("Event", {"fields": ("event_link", "sibling_todos")}),
        ("Tree", {"fields": ("tree_links", "tree_budget")}),
        ("Payload", {"fields": ("payload_json",)}),
        ("Wait", {"fields": ("waiting_for_json", "waits_until", "resolution_json")}),
        ("Progress", {"fields": ("progress_json", "checkpoint_json", "traceparent")}),
        ("Result", {"fields": ("result_json", "late_result_json")}),
        ("History", {"fields": ("timeline", "errors_json")}),
    )
    readonly_fields = flatten_fieldsets(fieldsets)

    @admin.display(description="limits")
    def limits_blocked(self, obj: Todo) -> str:
        """The named limits it names (issue 31) and, while one holding it is parked, until when and why."""
        selectors.show_blocked([obj])
        blocked = getattr(obj, "blocked", None)
        named = ", ".join(obj.limits or []) or "—"
        if blocked:
            return f"{named} · blocked: {blocked['limit']} parked until {blocked['until']} ({blocked['reason']})"
        return named

    # batches of "apply to every matching todo" (todos/admin/bulk.py)
    bulk_batch_size = 500
    bulk_request_cap = 5000
    bulk_request_seconds = 8.0

    class Media:
        css = {"all": ["todos/admin.css"]}

    # --- permissions: view, plus "operate" (the actions) for those who may change todos ----------
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # todos come from agents and webhooks

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # read-only: state changes only through actions

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # deleting is retention's job (manage.py purge)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("todos.change_todo")

    # --- the list -----------------------------------------------------------------------------
    def get_queryset(self, request: HttpRequest) -> QuerySet[Todo]:
        qs = super().get_queryset(request)
        match = request.resolver_match
        if match is None or match.url_name != "todos_todo_change":
            # The list reads only the last error's first characters from the heavy errors column.
            qs = qs.defer("payload", "result", "errors").annotate(last_error_text=show.last_error())
        return qs

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Todo], search_term: str
    ) -> tuple[QuerySet[Todo], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if ids.is_id(term, ids.TODO):
            return queryset.filter(pk=term), False  # the primary key: one index probe
        if ids.is_id(term, ids.EVENT):
            return queryset.filter(event_id=term), False
        # Exact keys and owners take a prefix: OR-ing them into the title search would keep the planner
        # from the trigram index (todo_title_trgm) and scan the whole table.
        field, _, value = term.partition(":")
        if value and field in ("key", "owner"):
            return queryset.filter(**{"idempotency_key" if field == "key" else "owner": value.strip()}), False
        return queryset.filter(title__icontains=term), False

    @admin.display(description="id")
    def short_id(self, obj: Todo) -> SafeString:
        # The full id is 35 characters; its first 11 keep the list readable at laptop width and
        # the full one is in the tooltip, the row's checkbox and the detail page.
        return format_html('<span title="{}">{}…</span>', obj.pk, obj.pk[:11])

    @admin.display(description="title")
    def short_title(self, obj: Todo) -> SafeString:
        return _shortened(obj.title, 24)

    @admin.display(description="last error")
    def last_error(self, obj: Todo) -> SafeString | str:
        text = getattr(obj, "last_error_text", None)
        return _shortened(text, 24) if text else "—"

    @admin.display(description="queue")
    def short_queue(self, obj: Todo) -> SafeString:
        return _shortened(obj.queue, 16)

    @admin.display(description="owner")
    def short_owner(self, obj: Todo) -> SafeString | str:
        return _shortened(obj.owner, 10) if obj.owner else "—"

    @admin.display(description="state")
    def state_badge(self, obj: Todo) -> SafeString:
        return show.state_badge(obj)

    @admin.display(description="tries")
    def attempts(self, obj: Todo) -> str:
        # The priority rides here when it is not the default: a column of its own would push the list
        # past 1280 px (the browser test), and most todos keep 0.
        tries = f"{obj.attempt}/{obj.max_attempts}"
        return f"{tries} · p{obj.priority}" if obj.priority else tries

    @admin.display(description="due")
    def due(self, obj: Todo) -> str:
        if states.CLAIMED.holds(obj):
            return f"lease {show.relative(obj.lease_expires_at)}"
        if states.RETRY_WAITING.holds(obj):
            return f"retry {show.relative(obj.next_retry_at)}"
        if states.SCHEDULED.holds(obj):
            return f"runs {show.relative(obj.run_at)}"
        return "—"

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: Todo) -> str:
        return show.relative(obj.created_at)

    # --- the detail page ------------------------------------------------------------------------
    @admin.display(description="payload")
    def payload_json(self, obj: Todo) -> SafeString:
        payload = obj.payload
        if obj.queue in SYSTEM_QUEUES and isinstance(payload, dict) and "secret" in payload:
            # A delivery to a URL carries its signing secret (todos/notices.py, notify_url): not for show.
            payload = {**payload, "secret": "whsec_… (hidden)"}
        return show.pretty_json(payload)

    @admin.display(description="progress")
    def progress_json(self, obj: Todo) -> SafeString:
        return show.pretty_json(obj.progress)

    @admin.display(description="checkpoint")
    def checkpoint_json(self, obj: Todo) -> SafeString:
        return show.pretty_json(obj.checkpoint)

    @admin.display(description="result")
    def result_json(self, obj: Todo) -> SafeString:
        return show.pretty_json(obj.result)

    @admin.display(description="waits for")
    def waiting_for_json(self, obj: Todo) -> SafeString | str:
        if obj.state != TodoState.WAITING:
            return "—"
        links = [
            format_html('<a href="{}">{}</a>', reverse("admin:todos_todo_change", args=[quote(i)]), i)
            for i in (obj.waiting_for or {}).get("todos", [])
            if isinstance(i, str)
        ]
        if "people" in (obj.waiting_for or {}):
            # A wait for people is decided (or reassigned) on its decision page (issue 29).
            links.append(format_html('<a href="{}">Open the decision page</a>', decide_path(obj.pk)))
        shown = show.pretty_json(obj.waiting_for)
        return format_html("{}{}", shown, format_html_join(" ", "{}", ((link,) for link in links))) if links else shown

    @admin.display(description="times out")
    def waits_until(self, obj: Todo) -> Any:
        if obj.state != TodoState.WAITING:
            return "—"
        wait = Waitpoint.objects.filter(todo_id=obj.pk, resolved_at__isnull=True).first()
        return f"{wait.timeout_at:%Y-%m-%d %H:%M:%S} UTC, then {wait.on_timeout}" if wait else "—"

    @admin.display(description="resolution")
    def resolution_json(self, obj: Todo) -> SafeString | str:
        return show.pretty_json(obj.resolution) if obj.resolution else "—"

    @admin.display(description="errors (raw)")
    def errors_json(self, obj: Todo) -> SafeString:
        return show.pretty_json(obj.errors)

    @admin.display(description="timeline")
    def timeline(self, obj: Todo) -> SafeString:
        return show.timeline_html(obj)

    @admin.display(description="event")
    def event_link(self, obj: Todo) -> SafeString | str:
        if not obj.event_id:
            return "—"
        url = reverse("admin:events_event_change", args=[quote(obj.event_id)])
        return format_html('<a href="{}">{}</a>', url, obj.event_id)

    @admin.display(description="lineage")
    def tree_links(self, obj: Todo) -> SafeString | str:
        """Parent and root (agent trees, issue 30), and the first children, each with its state (one probe of
        todo_children). The whole tree: GET /api/v1/todos/<id>/tree/."""
        children = Todo.objects.filter(parent_id=obj.pk).only("id", "state", "next_retry_at").order_by("id")
        shown = list(children[: MAX_TREE_CHILDREN_SHOWN + 1])
        if obj.parent_id is None and not shown:
            return "—"

        def link(todo_id: str) -> SafeString:
            return format_html(
                '<a href="{}">{}</a>', reverse("admin:todos_todo_change", args=[quote(todo_id)]), todo_id
            )

        items = format_html_join(
            " ",
            "{} {}",
            ((link(c.pk), show.state_badge(c)) for c in shown[:MAX_TREE_CHILDREN_SHOWN]),
        )
        more = "…" if len(shown) > MAX_TREE_CHILDREN_SHOWN else ""
        parent = link(obj.parent_id) if obj.parent_id else "none (a root)"
        return format_html(
            "parent {} · root {} · depth {}<br>children: {}{}",
            parent,
            link(obj.tree_root_id),
            obj.tree_depth,
            items or "none",
            more,
        )

    @admin.display(description="usage and budget")
    def tree_budget(self, obj: Todo) -> SafeString | str:
        """Its usage; a root's tree usage and budget (issue 30). An operator raises a budget with
        PATCH /api/v1/todos/<id>/budget/ or the "Set budget" action."""
        if obj.usage is None and obj.budget is None and obj.tree_usage is None:
            return "—"
        blocked = " · blocked: budget spent" if obj.budget_exhausted else ""
        return format_html(
            "usage {} · tree usage {} · budget {}{}",
            show.pretty_json(obj.usage),
            show.pretty_json(obj.tree_usage),
            show.pretty_json(obj.budget),
            blocked,
        )

    @admin.display(description="late result (after a cancel; kept, not applied)")
    def late_result_json(self, obj: Todo) -> SafeString | str:
        return show.pretty_json(obj.late_result) if obj.late_result is not None else "—"

    @admin.display(description="other todos of this event")
    def sibling_todos(self, obj: Todo) -> SafeString | str:
        if not obj.event_id:
            return "—"
        siblings = (
            Todo.objects.filter(event_id=obj.event_id)
            .exclude(pk=obj.pk)
            .only("id", "queue", "kind", "state", "next_retry_at")
            .order_by("created_at")[:50]
        )
        items = format_html_join(
            "",
            '<li><a href="{}">{}</a> {} {} {}</li>',
            (
                (reverse("admin:todos_todo_change", args=[quote(t.pk)]), t.pk, t.queue, t.kind, show.state_badge(t))
                for t in siblings
            ),
        )
        return format_html("<ul>{}</ul>", items) if items else "none"

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra_context = extra_context or {}
        # The admin's own links quote the id ("td_5F…"); look the todo up as get_object does.
        todo = Todo.objects.filter(pk=unquote(object_id)).only("state", "next_retry_at").first()
        if todo is not None and self.has_operate_permission(request):
            extra_context["todo_ops"] = ops_for(todo)
            extra_context["changelist_url"] = reverse("admin:todos_todo_changelist")
        return super().change_view(request, object_id, form_url, extra_context)

    # --- the actions --------------------------------------------------------------------------
    def get_urls(self) -> list[Any]:
        def view(request: HttpRequest, op_name: str) -> HttpResponse:
            return bulk_view(self, request, op_name)

        return [
            path("bulk/<str:op_name>/", self.admin_site.admin_view(view), name="todos_todo_bulk"),
            *super().get_urls(),
        ]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # The list has ten columns and a filter panel: give it the nav sidebar's width at laptop sizes.
        extra_context = {"is_nav_sidebar_enabled": False, **(extra_context or {})}
        narrowed = any(key not in ("p", "o", "_facets") for key in request.GET)
        if narrowed and self.has_operate_permission(request):
            query = request.GET.urlencode()
            extra_context["bulk_links"] = [
                (op.label, reverse("admin:todos_todo_bulk", args=[op.name]) + (f"?{query}" if query else ""))
                for op in OPS.values()
            ]
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        if context and "cl" in context and request.GET.get(DeadLetterFilter.parameter_name) == "yes":
            if LastErrorFilter.parameter_name not in request.GET:
                changelist = context["cl"]
                context["error_groups"], context["error_groups_sample"] = self.error_groups(
                    request, changelist.queryset, changelist.result_count
                )
        return response

    # --- triage: dead-letters grouped by their last error ----------------------------------------
    error_group_limit = 20
    # The box groups the newest this many of the listed dead-letters, not all of them: grouping reads
    # each one's errors (kilobytes of tracebacks, out of line), and after an outage that is 50,000 rows
    # on every page load (bench/admin/admin_changelist.py). The newest are what an operator triages first.
    error_group_sample = 2_000
    # Group actions: a whole group is retried or discarded through the batched every-matching run.
    error_group_ops = ("retry_reset", "retry_once", "discard")

    def error_groups(
        self, request: HttpRequest, matching: QuerySet[Todo], listed: int
    ) -> tuple[list[dict[str, Any]], int | None]:
        """The largest groups of the newest ``error_group_sample`` listed dead-letters by last error
        ("30 x timeout"), each with the list narrowed to it and the every-matching actions for it (those
        act on the whole group, not the sample); and the sample's size when it did not cover the whole
        list (``listed``: the changelist's count, capped well above the sample, so it tells). The newest
        come from a partial index of dead-letters (todo_failed_recent, or todo_dead_letters for one
        queue), then one GROUP BY over that many rows."""
        newest = matching.order_by("-updated_at").values("pk")[: self.error_group_sample]
        rows = (
            Todo.objects.filter(pk__in=newest)
            .annotate(group=show.last_error())
            .values("group")
            .annotate(n=Count("pk"))
            .order_by("-n", "group")[: self.error_group_limit]
        )
        may_operate = self.has_operate_permission(request)
        groups = []
        for row in rows:
            params = request.GET.copy()
            params.pop("p", None)
            params[LastErrorFilter.parameter_name] = row["group"] or ""
            query = params.urlencode()
            groups.append(
                {
                    "error": row["group"] or "(no error recorded)",
                    "count": row["n"],
                    "list_url": f"{reverse('admin:todos_todo_changelist')}?{query}",
                    "actions": [
                        (OPS[name].label, f"{reverse('admin:todos_todo_bulk', args=[name])}?{query}")
                        for name in self.error_group_ops
                    ]
                    if may_operate and row["group"]
                    else [],
                }
            )
        return groups, (self.error_group_sample if listed > self.error_group_sample else None)

    def run_op(self, request: HttpRequest, queryset: QuerySet[Todo], op: Op) -> HttpResponse | None:
        if request.POST.get("select_across") == "1":
            # "Select all N": never one unbounded request; hand over to the batched view.
            url = reverse("admin:todos_todo_bulk", args=[op.name])
            query = request.GET.urlencode()
            return HttpResponseRedirect(f"{url}?{query}" if query else url)
        ids = list(queryset.order_by("pk").values_list("pk", flat=True)[:MAX_SELECTED])
        if op.note_label and "confirm" not in request.POST:
            return TemplateResponse(
                request,
                "admin/todos/todo/action_confirm.html",
                {
                    **self.admin_site.each_context(request),
                    "opts": self.model._meta,
                    "title": f"{op.label}: {len(ids)} todo{'s' if len(ids) != 1 else ''}",
                    "op": op,
                    "ids": ids,
                    "return_to": request.POST.get("_return_to", ""),
                },
            )
        outcome = apply(
            op,
            ids,
            user_id=staff_user_id(request),
            operator=request.user.get_username(),
            note=request.POST.get("note", ""),
        )
        self.message_user(request, outcome.message(op), messages.SUCCESS if outcome.succeeded else messages.WARNING)
        return_to = request.POST.get("_return_to", "")
        if return_to and url_has_allowed_host_and_scheme(return_to, {request.get_host()}, request.is_secure()):
            return HttpResponseRedirect(return_to)
        return None


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin[Agent]):
    list_display = ("name", "owner", "is_active", "claim_scopes", "create_scopes", "token_prefix", "created_at")
    list_filter = ("is_active",)
    search_fields = ("name",)
    list_select_related = ("owner",)
    fields = (
        "name",
        "owner",
        "claim_scopes",
        "create_scopes",
        "can_retry_dead_letters",
        "can_manage_queues",
        "is_active",
        "token_prefix",
        "webhook_secret",
        "created_at",
    )
    # webhook_secret signs the callbacks of the todos the agent creates (issue 29): its producer needs it to
    # verify them, so staff who manage agents may read it; it authenticates nothing.
    readonly_fields = ("token_prefix", "webhook_secret", "created_at")
    actions = ["revoke", "rotate_token"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # The name is the owner identity on claims already made: fixed once the agent exists.
        return (*self.readonly_fields, "name") if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: Agent, form: Any, change: bool) -> None:
        if not change:
            # Kept on the request object only, for response_add to show once; never stored.
            request._new_agent_token = obj.set_new_token()  # type: ignore[attr-defined]
            obj.webhook_secret = new_webhook_secret()
        super().save_model(request, obj, form, change)

    def response_add(self, request: HttpRequest, obj: Agent, post_url_continue: str | None = None) -> HttpResponse:
        token = getattr(request, "_new_agent_token", None)
        if token is None:
            return super().response_add(request, obj, post_url_continue)
        return self._token_page(request, [(obj, token)], "Agent created")

    def _token_page(self, request: HttpRequest, pairs: list[tuple[Agent, str]], title: str) -> HttpResponse:
        response = TemplateResponse(
            request,
            "admin/todos/agent/token_once.html",
            {**self.admin_site.each_context(request), "opts": self.model._meta, "title": title, "pairs": pairs},
        )
        response["Cache-Control"] = "no-store"  # the plaintext must not linger in a cache
        return response

    @admin.action(description="Revoke (deactivate) the selected agents", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        agents = list(queryset.filter(is_active=True))
        queryset.filter(pk__in=[a.pk for a in agents]).update(is_active=False)
        notify_agents_changed()  # update() sends no signal: every process's token cache forgets them
        for agent in agents:
            self.log_change(request, agent, "Revoked (deactivated)")
        self.message_user(request, f"{len(agents)} agent(s) revoked; their tokens no longer authenticate.")

    @admin.action(description="Rotate token (the old one stops working)", permissions=["change"])
    def rotate_token(self, request: HttpRequest, queryset: QuerySet[Agent]) -> HttpResponse:
        pairs = []
        for agent in queryset.order_by("name"):
            token = agent.set_new_token()
            agent.save(update_fields=["token_hash", "token_prefix"])
            self.log_change(request, agent, "Token rotated")
            pairs.append((agent, token))
        return self._token_page(request, pairs, "Tokens rotated")


LIMIT_FIELDS = ("max_claimed", "rate_per_second", "rate_burst", "fair", "fair_weights", "max_claimed_per_key")


class QueueLimitsForm(forms.ModelForm[Queue]):
    class Meta:
        model = Queue
        fields = LIMIT_FIELDS
        help_texts = {
            "max_claimed": "At most this many live leases at once (lapsed ones do not count). Empty: no cap.",
            "rate_per_second": "At most this many claims a second. Empty: no limit.",
            "rate_burst": "The token bucket's size (default: one second's worth). It starts full when changed.",
            "fair": "Claims take the todos' fair keys in weighted round robin (docs/architecture.md).",
            "fair_weights": 'An object from fair key to weight, e.g. {"acme": 3}; others weigh 1.',
            "max_claimed_per_key": "At most this many live leases per fair key (1: one at a time). Empty: no cap.",
        }

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            controls.check_limits(**{k: data.get(k) for k in LIMIT_FIELDS})
        except InvalidTransitionInput as exc:
            for field, errors in exc.extra.get("fields", {}).items():
                self.add_error(field, errors)
        if data.get("rate_burst") is not None and data.get("rate_per_second") is None:
            self.add_error("rate_burst", "A burst needs a rate.")
        return data


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin[Queue]):
    """Every queue: its counts (selectors.queue_stats, the statement the API and the dashboard read), paused
    or not, its limits; pause and resume actions; the change page edits the limits. Every change goes through
    todos/controls.py, never a model save: the claim statement reads these columns."""

    form = QueueLimitsForm
    search_fields = ("name",)
    ordering = ("name",)
    list_filter = ("paused",)
    actions = ["pause_queues", "resume_queues"]
    fieldsets = (
        (None, {"fields": ("name", "paused_badge", "counts")}),
        (
            "Limits (enforced by every claim, in every process)",
            {"fields": ("max_claimed", "rate_per_second", "rate_burst")},
        ),
        ("Fair share (decided by every claim)", {"fields": ("fair", "fair_weights", "max_claimed_per_key")}),
    )
    readonly_fields = ("name", "paused_badge", "counts")

    def get_list_display(self, request: HttpRequest) -> Any:
        # One queue_stats() per page, read by the count columns below (bound to this request only).
        stats = {s.queue: s for s in selectors.queue_stats()}

        def column(attr: str, title: str) -> Any:
            def value(obj: Queue) -> int:
                return int(getattr(stats.get(obj.name), attr, 0))

            value.short_description = title  # type: ignore[attr-defined]
            return value

        return (
            "name",
            "paused_badge",
            column("pending", "pending"),
            column("claimed", "claimed"),
            column("waiting", "waiting"),
            column("retry_waiting", "retry-waiting"),
            column("dead_letters", "dead-letters"),
            column("cancelled", "cancelled"),
            "limits_summary",  # not "limits": a model field of that name would win over this column
            "todos_link",
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # queues come into being with their first todo

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Queue, form: Any, change: bool) -> None:
        controls.set_limits(obj.name, **{k: form.cleaned_data.get(k) for k in LIMIT_FIELDS})

    @admin.display(description="paused")
    def paused_badge(self, obj: Queue) -> SafeString | str:
        return format_html('<span class="sb-state sb-state-paused">{}</span>', "paused") if obj.paused else "—"

    @admin.display(description="limits")
    def limits_summary(self, obj: Queue) -> str:
        return controls.describe_limits(obj) or "—"

    @admin.display(description="now")
    def counts(self, obj: Queue) -> str:
        found = [s for s in selectors.queue_stats() if s.queue == obj.name]
        if not found:
            return "—"
        s = found[0]
        return (
            f"{s.pending} pending, {s.claimed} claimed, {s.waiting} waiting, {s.retry_waiting} retry-waiting, "
            f"{s.dead_letters} dead-letters, {s.cancelled} cancelled"
        )

    @admin.action(description="Pause the selected queues (claims hand out nothing)", permissions=["change"])
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        names = list(queryset.values_list("name", flat=True))
        for name in names:
            controls.pause(name)
            self.log_change(request, Queue(name=name), "Paused")
        self.message_user(request, f"{len(names)} queue(s) paused; creates still land.")

    @admin.action(description="Resume the selected queues", permissions=["change"])
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        names = list(queryset.values_list("name", flat=True))
        for name in names:
            controls.resume(name)
            self.log_change(request, Queue(name=name), "Resumed")
        self.message_user(request, f"{len(names)} queue(s) resumed.")

    @admin.display(description="todos")
    def todos_link(self, obj: Queue) -> SafeString:
        url = reverse("admin:todos_todo_changelist")
        return format_html(
            '<a href="{}?{}">todos</a> · <a href="{}?{}">dead-letters</a>',
            url,
            urlencode({"queue": obj.name}),
            url,
            urlencode({"queue": obj.name, "dead": "yes"}),
        )


class ScheduleForm(forms.ModelForm[Schedule]):
    class Meta:
        model = Schedule
        fields = (
            "name",
            "cron",
            "timezone",
            "queue",
            "kind",
            "title",
            "payload",
            "priority",
            "fair_key",
            "limits",
            "max_attempts",
            "catch_up",
            "is_active",
        )


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin[Schedule]):
    """Recurring schedules. The reapers make each tick's todo (todos/schedules.py); this page shows what
    they will do next and what they last made."""

    form = ScheduleForm
    list_display = (
        "name",
        "cron",
        "timezone",
        "queue",
        "is_active",
        "catch_up",
        "next_run",
        "last_tick_at",
        "last_todo",
    )
    list_filter = ("is_active", "catch_up")
    search_fields = ("name", "queue")
    ordering = ("name",)
    readonly_fields = ("next_run", "last_tick_at", "last_todo", "last_error", "created_at")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [*ScheduleForm.Meta.fields, *self.readonly_fields]

    @admin.display(description="next run")
    def next_run(self, obj: Schedule) -> str:
        if obj.pk is None:
            return "—"
        tick = next_tick(obj, timezone.now())
        if tick is None:
            return "never (the cron or time zone does not parse)"
        local = tick.astimezone(ZoneInfo(obj.timezone))
        return f"{local:%Y-%m-%d %H:%M %Z} ({show.relative(tick)})"

    @admin.display(description="last todo")
    def last_todo(self, obj: Schedule) -> SafeString | str:
        if not obj.last_todo_id:
            return "—"
        url = reverse("admin:todos_todo_change", args=[quote(obj.last_todo_id)])
        return format_html('<a href="{}">{}</a>', url, obj.last_todo_id)

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        if change and {"cron", "timezone", "is_active"} & set(form.changed_data):
            # The reapers work out the next tick again from the new expression (ticks already made stay).
            obj.next_tick_at = None
        super().save_model(request, obj, form, change)


# The console's login counts failures per name and per address and locks either past its limit (issue 28).
admin.site.login_form = ThrottledAdminLoginForm


@admin.register(NotifyEndpoint)
class NotifyEndpointAdmin(admin.ModelAdmin[NotifyEndpoint]):
    """Where a person's or a group's notices go besides email (issue 29): a signed webhook receiver. The URL
    passes the SSRF guard on save (NotifyEndpoint.clean); the signing secret is shown once, on creation and
    on rotation."""

    list_display = ("__str__", "user", "group", "url", "active", "events", "created_at")
    list_filter = ("active",)
    search_fields = ("url", "user__username", "group__name")
    list_select_related = ("user", "group")
    fields = ("user", "group", "url", "active", "events", "created_at")
    readonly_fields = ("created_at",)
    actions = ["rotate_secret"]

    def response_add(
        self, request: HttpRequest, obj: NotifyEndpoint, post_url_continue: str | None = None
    ) -> HttpResponse:
        return self._secret_page(request, [obj], "Endpoint created")

    @admin.action(description="Rotate the signing secret (the old one stops verifying)", permissions=["change"])
    def rotate_secret(self, request: HttpRequest, queryset: QuerySet[NotifyEndpoint]) -> HttpResponse:
        endpoints = list(queryset[:MAX_SELECTED])
        for endpoint in endpoints:
            endpoint.secret = new_webhook_secret()
            endpoint.save(update_fields=["secret"])
        return self._secret_page(request, endpoints, "Secrets rotated")

    def _secret_page(self, request: HttpRequest, endpoints: list[NotifyEndpoint], title: str) -> HttpResponse:
        response = TemplateResponse(
            request,
            "admin/todos/notifyendpoint/secret_once.html",
            {**self.admin_site.each_context(request), "opts": self.model._meta, "title": title, "endpoints": endpoints},
        )
        response["Cache-Control"] = "no-store"
        return response


@admin.register(Limit)
class LimitAdmin(admin.ModelAdmin[Limit]):
    """Named limits (issue 31): their settings and parks. Changes go through todos/flow.py (PUT's rules), never
    a model save; an operator lifts a park with the action."""

    list_display = ("name", "max_claimed", "rate_per_second", "rate_burst", "per_key", "parked_until", "park_reason")
    search_fields = ("name",)
    ordering = ("name",)
    actions = ["lift_parks"]
    readonly_fields = (
        "name", "max_claimed", "rate_per_second", "rate_burst", "per_key", "parked_until", "park_reason", "created_at",
    )  # fmt: skip

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # PUT /api/v1/limits/<name>/ defines one

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("todos.change_queue")

    @admin.action(description="Lift the park (its todos are claimable again)", permissions=["change"])
    def lift_parks(self, request: HttpRequest, queryset: QuerySet[Limit]) -> None:
        names = list(queryset.values_list("name", flat=True))
        for name in names:
            flow.unpark(name)
        self.message_user(request, f"{len(names)} limit(s) unparked.")
