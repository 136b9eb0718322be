"""Liveness, readiness and Prometheus metrics: plain Django views, no authentication by agent token.

/healthz  the request path moves: answered from the process's pool of threads (so the event loop and the
          pool both move), with one database round trip bounded by a statement timeout. An unreachable
          database is reported but is no reason to restart (that is readiness); a round trip that
          times out is (503). The watchdog (switchboard/watchdog.py) replaces a stuck process by itself.
/readyz   the database answers and every migration is applied: the readiness probe. A new release
          started before `migrate` ran reports 503 until it has, instead of serving with old tables.
/metrics  Prometheus text; optionally limited by METRICS_TOKEN and/or METRICS_ALLOWED_NETWORKS.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import threading

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from switchboard import dberrors, metrics
from switchboard.api import error_body

logger = logging.getLogger(__name__)

# Once every migration is applied it stays so for the life of this process (a newer release's
# migrations arrive with a newer process), so the check runs until it first succeeds, then never.
_migrations_applied = threading.Event()


def _unavailable(detail: str, reason: str, **extra: object) -> JsonResponse:
    logger.warning("not ready: %s", reason)
    response = JsonResponse(
        error_body("unavailable", detail, reason=reason, **extra), status=503, headers={"Retry-After": "5"}
    )
    # Probes repeat every few seconds: the warning above is enough, without Django's ERROR line too.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    database = _round_trip(settings.HEALTHZ_DATABASE_TIMEOUT_MS)
    if database == "timeout":
        return _unavailable(
            f"A database round trip took over {settings.HEALTHZ_DATABASE_TIMEOUT_MS} ms.", "database_timeout"
        )
    return JsonResponse({"status": "ok", "database": database})


def _round_trip(timeout_ms: int) -> str:
    """ "ok", "unreachable" or "timeout": one SELECT on this thread's connection, in a transaction whose
    statement timeout (SET LOCAL: nothing outlives it, even behind PgBouncer) bounds it."""
    connection = connections[DEFAULT_DB_ALIAS]
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL statement_timeout = {int(timeout_ms)}")
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        connection.close_if_unusable_or_obsolete()
        failure = dberrors.log_failure(logger, "health check", exc)
        return "timeout" if failure is dberrors.Failure.TIMEOUT else "unreachable"
    return "ok"


def pending_migrations(alias: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Migrations on disk that the database has not recorded as applied ("app.name")."""
    executor = MigrationExecutor(connections[alias])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _backwards in plan]


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    connection = connections[DEFAULT_DB_ALIAS]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        if not _migrations_applied.is_set():
            pending = pending_migrations()
            if pending:
                return _unavailable(
                    f"{len(pending)} migration(s) not applied; run manage.py migrate.",
                    "migrations_pending",
                    pending=pending,
                )
            _migrations_applied.set()
    except DatabaseError as exc:
        # The broken connection must not be reused by this thread's next request.
        connection.close_if_unusable_or_obsolete()
        dberrors.log_failure(logger, "readiness check", exc)
        return _unavailable("The database is unreachable.", "database_unreachable")
    return JsonResponse({"status": "ok"})


def _client_allowed(request: HttpRequest) -> bool:
    networks = settings.METRICS_ALLOWED_NETWORKS
    if not networks:
        return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in network for network in networks)


def _token_ok(request: HttpRequest) -> bool:
    expected = settings.METRICS_TOKEN
    if not expected:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode())


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _client_allowed(request):
        return JsonResponse(error_body("forbidden", "Metrics are not served to this address."), status=403)
    if not _token_ok(request):
        return JsonResponse(
            error_body("unauthorized", "A valid metrics bearer token is required."),
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
        )
    # Without the database the answer is still 200: the counters, and switchboard_database_up 0.
    return HttpResponse(metrics.render_latest(), content_type=CONTENT_TYPE_LATEST)
