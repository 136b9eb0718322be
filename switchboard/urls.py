from django.conf import settings
from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from switchboard import api, health

# The operator console is Switchboard's, not "Django administration".
admin.site.site_header = "Switchboard"
admin.site.site_title = "Switchboard"
admin.site.index_title = "Operations"

urlpatterns = [
    # The queue dashboard (staff only), before the admin's catch-all.
    path("admin/", include("todos.admin.urls")),
    path("admin/", admin.site.urls),
    path("ingest/", include("ingest.urls")),
    # Waits for people (issue 29): /decide/<todo_id>/, /inbox/, /login/.
    path("", include("todos.people.urls")),
    # Before the todos API's api/v1/ include, which would otherwise see events/ first.
    path("api/v1/events/", include("events.api.urls")),
    path("api/v1/", api.api_root, name="api-root"),
    path("api/v1/", include("todos.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    # Last under api/: anything unmatched answers JSON 404 (naming the slashed path if that exists).
    re_path(r"^api/(?P<rest>.*)$", api.api_not_found, name="api-not-found"),
]

# Operations. No trailing slash: probes and Prometheus use these exact paths (SECURE_REDIRECT_EXEMPT
# names them).
urlpatterns += [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics_view, name="metrics"),
]

if settings.TEST_HOOKS:  # only under the test settings, when a test asks (switchboard/test_hooks.py)
    from switchboard import test_hooks

    urlpatterns += [path("_test/stall/<str:what>", test_hooks.stall), path("_test/busy", test_hooks.busy)]
