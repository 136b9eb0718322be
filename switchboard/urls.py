from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("ingest/", include("ingest.urls")),
    path("api/v1/events/", include("events.api.urls")),
]
