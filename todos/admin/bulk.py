""" "Apply to every todo matching the current filter": for the 50,000 dead-letters after an outage.

Design: the work runs inside the operator's requests, in batches. Each batch reads the next
``batch_size`` matching ids in id order after the last one seen (keyset, so a batch never rescans
what was done and the matching set may shrink as it goes), then runs the action one guarded UPDATE
per todo, each its own short transaction: no lock is held across rows or batches. A request stops
after ``request_budget_seconds`` or ``request_cap`` todos, well under any proxy or gunicorn timeout,
and answers a progress page whose "Continue" form carries the position (the last id), the running
totals and the note; a few lines of inline script press Continue by themselves, so the operator
watches it run to the end (and can pause by leaving the page). Why not a background thread with a
progress row: a thread dies silently with its gunicorn worker, needs a table and a poller, and
could run on after the operator has gone; this way an interrupted run is simply resumed from the
page it stopped on, and re-running it is harmless (a finished todo is skipped by its guard).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from switchboard.admin_tools import staff_user_id
from switchboard.ids import TODO, is_id
from todos.admin.ops import OPS, Outcome, apply

if TYPE_CHECKING:
    from todos.admin import TodoAdmin


def _changelist_url(query: str) -> str:
    url = reverse("admin:todos_todo_changelist")
    return f"{url}?{query}" if query else url


def _running_totals(request: HttpRequest) -> Outcome:
    """The counts so far, carried by the Continue form; malformed ones start again from zero."""
    try:
        succeeded = int(request.POST.get("succeeded", "0") or 0)
        skipped = json.loads(request.POST.get("skipped", "{}") or "{}")
        totals = Outcome(succeeded=succeeded)
        totals.skipped.update({str(k): int(v) for k, v in skipped.items()})
    except (ValueError, TypeError, AttributeError, RecursionError):  # RecursionError: JSON nested too deep
        return Outcome()
    return totals


def bulk_view(model_admin: TodoAdmin, request: HttpRequest, op_name: str) -> HttpResponse:
    op = OPS.get(op_name)
    if op is None:
        raise Http404("No such action.")
    if not model_admin.has_operate_permission(request):
        raise PermissionDenied
    query = request.GET.urlencode()
    try:
        cl = model_admin.get_changelist_instance(request)
    except IncorrectLookupParameters:
        messages.error(request, "That filter is not valid any more.")
        return HttpResponseRedirect(_changelist_url(""))
    matching = cl.queryset
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": f"{op.label}: every matching todo",
        "op": op,
        # Every filter of the todo list is a SimpleListFilter (todos/admin/filters.py).
        "filters": [
            (spec.title, spec.value())
            for spec in cl.filter_specs
            if isinstance(spec, admin.SimpleListFilter) and spec.value()
        ],
        "search": cl.query,
        "changelist_url": _changelist_url(query),
    }
    if not context["filters"] and not context["search"]:
        # One click must never retry or discard every todo there is: narrow it down first.
        messages.error(request, "Choose a filter or a search first: an action for every todo is not offered.")
        return HttpResponseRedirect(_changelist_url(query))
    if request.method != "POST":
        context["estimate"] = cl.result_count
        context["estimate_capped"] = cl.paginator.count_is_capped
        context["estimate_rough"] = cl.paginator.count_is_estimate
        return TemplateResponse(request, "admin/todos/todo/bulk_confirm.html", context)

    # The form's own values come back from the browser: a NUL (which PostgreSQL's text refuses) or a
    # position that is not an id starts again from the first todo, as malformed totals do.
    note = request.POST.get("note", "")[:1000].replace("\x00", "")
    after = request.POST.get("after", "")
    if after and not is_id(after, TODO):
        after = ""
    totals = _running_totals(request)
    started = time.monotonic()
    handled = 0
    finished = False
    while handled < model_admin.bulk_request_cap and time.monotonic() - started < model_admin.bulk_request_seconds:
        ids = list(
            matching.filter(pk__gt=after).order_by("pk").values_list("pk", flat=True)[: model_admin.bulk_batch_size]
        )
        if not ids:
            finished = True
            break
        totals.add(apply(op, ids, user_id=staff_user_id(request), operator=request.user.get_username(), note=note))
        handled += len(ids)
        after = ids[-1]

    if finished:
        messages.success(request, f"Every matching todo: {totals.message(op)}")
        return HttpResponseRedirect(_changelist_url(query))
    context.update(
        note=note,
        after=after,
        succeeded=totals.succeeded,
        skipped_json=json.dumps(dict(totals.skipped)),
        progress=totals.message(op),
        processed=totals.succeeded + totals.skipped.total(),
    )
    return TemplateResponse(request, "admin/todos/todo/bulk_progress.html", context)
