"""The todos app's own admin pages, mounted under admin/ by switchboard/urls.py (staff only:
admin_view sends anyone else to the admin login)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from todos import dashboard

urlpatterns = [
    path("dashboard/", admin.site.admin_view(dashboard.dashboard_view), name="admin-dashboard"),
    path("dashboard.json", admin.site.admin_view(dashboard.dashboard_json), name="admin-dashboard-json"),
]
