"""The todos app's own admin pages, mounted under admin/ by switchboard/urls.py (staff only:
admin_view sends anyone else to the admin login)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.urls import path

from todos import dashboard


def _needs_a_view_permission(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Queue counts are what the queue and todo lists show: staff without a view permission on either see
    neither (issue 28: staff get what their Django permissions give them)."""

    @functools.wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not (request.user.has_perm("todos.view_queue") or request.user.has_perm("todos.view_todo")):
            raise PermissionDenied
        return view(request, *args, **kwargs)

    return checked


urlpatterns = [
    path(
        "dashboard/",
        admin.site.admin_view(_needs_a_view_permission(dashboard.dashboard_view)),
        name="admin-dashboard",
    ),
    path(
        "dashboard.json",
        admin.site.admin_view(_needs_a_view_permission(dashboard.dashboard_json)),
        name="admin-dashboard-json",
    ),
]
