from __future__ import annotations

from django.urls import path

from events.api import views

app_name = "events"

urlpatterns = [
    path("", views.EventList.as_view(), name="list"),
    path("<str:pk>/", views.EventDetail.as_view(), name="detail"),
    path("<str:pk>/replay/", views.EventReplay.as_view(), name="replay"),
]
