from __future__ import annotations

from django.urls import path, re_path

from ingest import views

app_name = "ingest"

urlpatterns = [
    path("<str:slug>/", views.receive, name="receive"),
    # Without the trailing slash too: a provider's URL field is easy to fill in without one, and a
    # redirect would lose the POST body.
    re_path(r"^(?P<slug>[^/]+)$", views.receive),
]
