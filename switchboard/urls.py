from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from switchboard import health

urlpatterns = [
    # The queue dashboard (staff only), before the admin's catch-all.
    path("admin/", include("todos.admin_urls")),
    path("admin/", admin.site.urls),
    path("ingest/", include("ingest.urls")),
    # Before the todos API's api/v1/ include, which would otherwise see events/ first.
    path("api/v1/events/", include("events.api.urls")),
    path("api/v1/", include("todos.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]

# Operations. No trailing slash: probes and Prometheus use these exact paths (SECURE_REDIRECT_EXEMPT
# names them).
urlpatterns += [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics_view, name="metrics"),
]
