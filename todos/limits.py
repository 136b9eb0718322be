"""Every bound the service enforces, in one place (issue 34).

Serializers, the queue service, MCP schemas, the API's descriptions and the Python client (through a contract
test) read these names; none restates a number. A bound an operator may tune is a Django setting instead,
read where it is enforced and documented in docs/deploy.md: MAX_PAYLOAD_BYTES (payload, result and
resolution data), MAX_REQUEST_BYTES (any request body), INGEST_MAX_BODY_BYTES (a delivery),
QUEUE_MAX_LEASE_SECONDS (a lease).
"""

from __future__ import annotations

from django.conf import settings

# --- Claims ---
MAX_CLAIM_BATCH = 100  # todos one claim may take: a worker's batch, bounded so one answer stays small
LONG_POLL_MAX_SECONDS = 20.0  # wait_seconds of a claim or an await: under every proxy's idle timeout
# An idle claim long-poll answers [] at a random point in the last tenth of its wait_seconds: clients that
# began together (a deploy, a reconnect storm) drift apart instead of re-polling in one burst each cycle,
# which at 2,000 waiters queued a wake behind ~1,000 re-polls (docs/benchmarks.md, "Waiting costs nothing").
LONG_POLL_IDLE_SPREAD = 0.1

# Fair claims (issue 31's cost bar): how long a process remembers that a claim's (scopes, queues) found a fair or
# keyed queue eligible, and so runs CLAIM_NEXT_FAIR without first asking CLAIM_NEXT (todos/queue/claim.py); and
# how many such (scopes, queues) it remembers at most (the queues filter is the caller's: forgotten all at once
# beyond this).
KEYED_SCOPES_MEMO_SECONDS = 10.0
KEYED_SCOPES_MEMO_MAX = 1024


def fair_reserve() -> int:
    """Tags a contended fair turn reserves beyond the todos it claims (FAIR_RESERVE, default 32; 0: off): a fair
    claimer that had to wait for the queue's row charges the next FAIR_RESERVE tags to their keys' passes as
    today's walk would, claims its own and leaves the rest in todos_fairready, which later claimers take without
    the queue's lock (todos/sql/claim.py, CLAIM_FAIR_READY). A turn then serves several claims: at 16 claimers
    on 2 cores a turn (~1.2 ms) served one, and fair claims topped out near 800/s (docs/benchmarks.md). The
    bound, rounded up to whole batches of the claim's limit, is what a newcomer key waits per claimer that queued
    for the turn, in claims, beyond today's rule, and only under contention (docs/architecture.md)."""
    return max(0, int(settings.FAIR_RESERVE))


# --- Creates ---
MAX_CREATE_BATCH = 1000  # todos one batch create may insert: one statement, about 0.1 s (docs/benchmarks.md)
MAX_DEPENDENCIES = 100  # depends_on and depends_on_index of one todo together
MAX_DELAY_SECONDS = 365 * 24 * 3600  # how far ahead run_at / delay_seconds may reach
MAX_FAIR_KEY_CHARS = 200  # a fair_key: a tenant's name, not data
# How far below its root a todo may be, whatever its queue's max_depth: a chain of agents each spawning one
# child is a runaway loop long before this, and the depth column is a smallint (32,767).
MAX_TREE_DEPTH = 1000

# --- The holder's doors ---
MAX_COMPLETE_BATCH = 100  # completions one batch complete may carry: one statement
MAX_ERROR_CHARS = 10_000  # a fail's error text: a traceback's tail, kept in errors
MAX_NOTE_CHARS = 1_000  # an operator's note, kept in errors
MAX_PROGRESS_MESSAGE_CHARS = 500  # a heartbeat's progress message: a status line
MAX_RETRY_IN_SECONDS = 7 * 24 * 3600.0  # a fail's retry_in_seconds
MAX_CHECKPOINT_BYTES = 64 * 1024  # a checkpoint: what a retry needs to resume, not the work's data

# --- Waits ---
WAIT_TIMEOUT_MAX_SECONDS = 30 * 24 * 3600  # a wait's timeout_seconds: a person may take a month
MAX_AWAITED = 100  # todos one wait may name in for.todos
MAX_MATCH_PATHS = 20  # dotted paths of an event wait's match
MAX_MATCHABLE_LEAVES = 5000  # a delivery's payload leaves that get a key; deeper leaves are not matchable

# --- Reads ---
DEPENDENCY_RESULTS_MAX_BYTES = 64 * 1024  # dependencies' results shown on a claimed todo, together
MAX_SHOWN_RESULT_CHARS = 4_000  # an awaited todo's result shown in resolution.todos, each
MAX_TREE_PAGE = 100  # nodes one page of GET /todos/<id>/tree/ answers: each is a few short fields
# Nodes the subtree of a todo that is not a root is walked through (parent to children) for one page: the
# walk visits the whole subtree up to this bound, then answers "truncated". A root's tree pages by index
# instead (todo_tree) and has no such bound. 10,000 nodes walk in tens of milliseconds.
MAX_TREE_WALK = 10_000
# Cascading cancel (issue 30): descendants one statement cancels (a cascade over 10,000 is one statement,
# under 2 s: bench/claim/tree_costs.py); a bigger tree is finished by reap_once, this many a step. The
# trigger of children: "cancel" (todos/sql/functions/todos_children_cancel.sql) writes the same number.
CASCADE_BATCH = 10_000
# Cascades left over that one reap_once step resumes.
CASCADES_PER_REAP = 100
# Budgets (issue 30): a usage report or a budget is at most this many named counters, each name this long
# (letters, digits, _ . -), each value a non-negative number up to MAX_USAGE_VALUE (a typo beyond).
MAX_USAGE_COUNTERS = 16
MAX_USAGE_NAME_CHARS = 64
MAX_USAGE_VALUE = 1e15
MAX_LIST_LIMIT = 100  # todos one MCP list_todos answers
DEFAULT_LIST_LIMIT = 20

# A2A (todos/a2a/, issue 33): a message's id is a key, not data; its parts are bounded again, in bytes, as
# the todo's payload (MAX_PAYLOAD_BYTES). A stream re-reads its task this often between the wake-ups of a
# finish (no thread waits in between): how late it shows a claim, progress or a wait for input.
A2A_MAX_MESSAGE_ID_CHARS = 200
A2A_MAX_PARTS = 100
A2A_STREAM_POLL_SECONDS = 2.0
# A2A push notification configs (todos/a2a/push.py): at most this many per task (each transition of the task
# sends one delivery per config), each config's id, token and Authorization credentials at most this long.
A2A_MAX_PUSH_CONFIGS = 10
A2A_MAX_PUSH_ID_CHARS = 100
A2A_MAX_PUSH_SECRET_CHARS = 1000
# MCP Tasks on the 2025-11-25 wire: a client listening on GET /mcp gets notifications/tasks/status for its
# tasks, found by re-reading them this often (a changed row is seen once, late by at most this much).
MCP_TASK_STATUS_POLL_SECONDS = 2.0
MCP_TASK_STATUS_BATCH = 100  # changed tasks one re-read sends; the rest on the next

# --- Queue controls and schedules ---
MAX_QUEUE_LIMIT = 1_000_000  # max_claimed, rate_per_second and rate_burst: beyond this a limit is a typo
SCHEDULE_CATCH_UP_MAX = 100  # ticks one schedule makes after downtime with catch_up "all" (the latest)

# --- Named limits (issue 31) ---
MAX_LIMIT_NAME_CHARS = 100  # a limit's name: a provider or a quota's name ("openai", "github:acme"), not data
MAX_LIMITS_NAMED = 4  # limits one todo (or one queue) names: each claim locks and counts every one of them
MAX_PARK_SECONDS = 7 * 24 * 3600  # how far ahead a park may reach: a quota wall resets within days
MAX_PARK_REASON_CHARS = 500  # a park's reason: the provider's message, e.g. "429: resets 01:00"

# --- The admin ---
MAX_SELECTED = 500  # todos one admin action changes in a request (more: "every matching", in batches)
MAX_SHOWN_JSON_CHARS = 100_000  # JSON shown on an admin page before it is truncated
MAX_TREE_CHILDREN_SHOWN = 20  # a parent's children listed on its admin page; GET /todos/<id>/tree/ pages the rest

# --- Request bodies and JSON nesting (issue 28: bounded bodies, deep nesting) -----------------------
# How deep a JSON value taken from a caller (a payload, a result, a checkpoint, a wait's resolution data)
# may nest. Real documents nest about 10 levels (GitHub's webhooks); Python's recursion limit is 1,000
# frames, and every later encoding of the value (jsonb, the response, an MCP result) recurses once per
# level from wherever it runs: a value accepted at depth 900 by the serializer failed, as a 500, in
# psycopg's encoder a few frames further down. A tenth of the limit leaves every encoder room.
MAX_JSON_DEPTH = 100

# --- Scope patterns, queues per create scope, fair_weights (issue 28: H1, M4, L7) -------------------------
# Wildcards (* and ?, runs of * counted once) in one scope or claim glob. Matching is linear whatever
# the count (todos/globs.py); the bound keeps the SQL LIKE patterns and each match's work small, and real
# scopes use one or two (github.*, jobs.*.high).
MAX_SCOPE_WILDCARDS = 8
# Keys in one queue's fair_weights. Every fair claim reads the whole object (todos/sql/claim.py), and keys
# beyond the tenants a queue really weighs are a producer's Sybil keys, not configuration.
MAX_FAIR_WEIGHTS_KEYS = 1000


def max_queues_per_create_scope() -> int:
    """Queues that may exist under one glob create scope before an agent may add no more through it
    (MAX_QUEUES_PER_CREATE_SCOPE, default 1000). Every queue costs each claim whose scopes cover it an index
    descent, and GET /queues/, the dashboard and /metrics a row each; a thousand is far more than a real
    fan-out of queue names (one per repository, per customer tier) and small enough to keep those cheap.
    Existing queues, exact-name scopes, staff and the system (routes, schedules) are never limited."""
    return int(settings.MAX_QUEUES_PER_CREATE_SCOPE)


# --- Webhooks and input checks (issue 28: ingest) ---------------------------------------------------


def ingest_replay_window_seconds() -> int:
    """How long a body-only-signed delivery's body is remembered (settings.INGEST_REPLAY_WINDOW_SECONDS,
    30 days): a capture resent with a fresh delivery id inside it is a duplicate. Ten times GitHub's
    3-day redelivery horizon, and the check is one index probe per delivery whatever the window, so the
    only cost of a long one is a legitimate identical body (in practice a repeated GitHub ping) being
    answered as the first."""
    return int(settings.INGEST_REPLAY_WINDOW_SECONDS)


# Signature timestamps (Stripe's t=, Standard Webhooks' and plain HMAC's): a Unix time in seconds has 10
# digits until 2286; 12 leaves room, and keeps int() away from inputs thousands of digits long.
MAX_TIMESTAMP_DIGITS = 12

# --- Per-agent budgets of server resources (issue 28, M3) -------------------------------------------
# Each is read on every use, so a test (or a settings override) changes it at once. All are per web
# process: todos/budgets.py says why.


def max_waits_per_agent() -> int:
    """Long-polls and awaits one agent may have open in one process (AGENT_MAX_WAITS, default 100: a
    worker fleet sharing one token runs tens of long-polls; a hundred leaves room, while 10,000 of them
    would cost the process's wake-ups and the awaits' shared read). 0: no cap."""
    return int(settings.AGENT_MAX_WAITS)


def agent_rate_per_second() -> float:
    """Requests a second per agent token and process (AGENT_RATE_PER_SECOND, default 1000: far above a
    worker's pace, about what one process serves, so one token cannot take a process alone). 0: off."""
    return float(settings.AGENT_RATE_PER_SECOND)


def agent_rate_burst() -> int:
    """The token bucket's size (AGENT_RATE_BURST, default 2000: two seconds at the default rate)."""
    return max(1, int(settings.AGENT_RATE_BURST))


def answer_page_max_bytes() -> int:
    """Bytes of rendered todos one list answer carries before it stops early (API_PAGE_MAX_BYTES, default
    4 MiB, read by switchboard/api.py's pagination too: a page of 100 whole todos could be 100 MB; 4 MiB is
    thousands of ordinary todos' worth and a bounded cost per request)."""
    return int(settings.API_PAGE_MAX_BYTES)


# Seconds a client refused for too many open waits is told to wait (Retry-After): a wait lasts at most
# 20 s, and most end sooner, when work comes.
WAIT_SLOT_RETRY_AFTER_SECONDS = 1


# --- The operator console's login (issue 28, L6) -------------------------------------------------------


def admin_login_max_failures() -> int:
    """Failed logins to one user name before it is locked (ADMIN_LOGIN_MAX_FAILURES, default 5: a person
    mistypes a password two or three times; a guesser needs millions of tries, and gets 5 a lockout)."""
    return max(1, int(settings.ADMIN_LOGIN_MAX_FAILURES))


def admin_login_max_failures_per_address() -> int:
    """Failed logins from one client address, whatever the names (ADMIN_LOGIN_MAX_FAILURES_PER_ADDRESS,
    default 30: several people behind one office NAT, each mistyping; a sprayer of names is stopped)."""
    return max(1, int(settings.ADMIN_LOGIN_MAX_FAILURES_PER_ADDRESS))


def admin_login_lockout_seconds() -> int:
    """How long failures are counted, and how long a lockout lasts (ADMIN_LOGIN_LOCKOUT_SECONDS, default
    900: 15 minutes caps a guesser at 5 tries a quarter hour per name, and a locked-out person waits little)."""
    return max(1, int(settings.ADMIN_LOGIN_LOCKOUT_SECONDS))


# --- Waits (issue 28: what a wait may describe, who may resolve it, how many an agent keeps open) ---

# A wait's ``for`` as compact JSON: a todos list of 100 ids is about 3.8 KB, an event wait with a few match
# paths a few hundred bytes; it is copied into ``errors`` on every wait, so it stays small.
WAIT_FOR_MAX_BYTES = 4096
# One match value: a SHA, a customer or repository id, a branch name fit many times over.
WAIT_MATCH_VALUE_MAX_CHARS = 512
# ``resolvers``: who besides the token holder and operators may resolve a wait. A handful names a team;
# each is matched in the resolve statement's WHERE, so the list stays short.
WAIT_RESOLVERS_MAX = 20
# A resolver scope glob is a claim scope's shape; its wildcards are bounded like a claim pattern's.
WAIT_RESOLVER_WILDCARDS_MAX = 8
# A todo's ``errors`` keeps its last this many entries: every statement that appends drops older ones,
# so a todo that waits again and again (each wait gives its attempt back) cannot grow without bound.
ERRORS_KEPT = 100


# --- Waits for people (issue 29: a question to a person, todos/people/) ---

# A people wait's ``for`` as JSON: the body, the proposed arguments and the edit schema together. Only its
# names, title and decisions are copied into ``errors`` (waiting_for); the rest stays on its waitpoint.
PEOPLE_WAIT_MAX_BYTES = 48 * 1024
PEOPLE_TITLE_MAX_CHARS = 200  # a subject line
PEOPLE_BODY_MAX_BYTES = 8 * 1024  # the question's markdown, as UTF-8: a page to read on a phone
PEOPLE_MAX_NAMED = 50  # users and groups one wait (or its escalation, or a reassignment) names together
PEOPLE_ARGUMENTS_MAX_BYTES = 16 * 1024  # the proposed arguments shown, and an edit's arguments sent back
PEOPLE_SCHEMA_MAX_PROPERTIES = 50  # fields of an edit form: each a labelled input on the page
PEOPLE_SCHEMA_MAX_ENUM = 100  # choices of one enum field: a select box
PEOPLE_SCHEMA_MAX_STRING_CHARS = 10_000  # a string field's maxLength (and an edited string without one)
PEOPLE_TEXT_MAX_CHARS = 4_000  # a respond's text, or a note with any decision
PEOPLE_REMIND_MIN_SECONDS = 60  # remind_after_seconds / escalate_after_seconds: not a notice storm
PEOPLE_LABEL_MAX_CHARS = 200  # an edit field's name, title or description: a label on the page
PEOPLE_INBOX_MAX = 500  # questions one inbox page lists, oldest first: more than a person works through
PEOPLE_SHOWN_JSON_CHARS = 20_000  # the payload and the arguments on the decision page, each, before "truncated"


def decision_link_ttl_seconds() -> int:
    """How long a signed decision link works (DECISION_LINK_TTL_SECONDS, default 3 days; never past the
    wait's timeout): long enough for a weekend, short enough that an old mail is not a key."""
    return max(60, int(settings.DECISION_LINK_TTL_SECONDS))


def max_open_event_waits_per_agent() -> int:
    """Open event waits one agent may hold (429 beyond): each is probed by every delivery of its source."""
    return int(settings.MAX_OPEN_EVENT_WAITS_PER_AGENT)


# --- Outbound notices (issue 29, todos/notices.py, todos/outbound.py) ---
OUTBOUND_MAX_URL_CHARS = 2000  # an endpoint's or a callback's URL
OUTBOUND_CONNECT_TIMEOUT_SECONDS = 5.0  # connecting to a receiver
OUTBOUND_TIMEOUT_SECONDS = 10.0  # reading its answer, and the whole request at most (a slow receiver fails)
OUTBOUND_MAX_REDIRECTS = 3  # hops followed, each checked by the SSRF guard again
OUTBOUND_MAX_BODY_BYTES = 256 * 1024  # a webhook's JSON body (a todo's JSON is cut before it grows past this)
OUTBOUND_MAX_RESPONSE_BYTES = 4 * 1024  # a receiver's answer read into a failure's error, at most
NOTIFY_LEASE_SECONDS = 60  # a delivery's lease: a send takes at most OUTBOUND_TIMEOUT_SECONDS per hop


def notify_max_attempts() -> int:
    """Attempts per delivery before it dead-letters (settings.NOTIFY_MAX_ATTEMPTS): with the queue's backoff
    (QUEUE_RETRY_BASE_SECONDS doubling up to its cap), 8 attempts span about 20 minutes at the defaults."""
    return max(1, int(settings.NOTIFY_MAX_ATTEMPTS))


# --- MCP Events (issue 33 item 2, todos/event_feed.py, todos/mcp/events.py) ---
EVENTS_DEFAULT_MAX_EVENTS = 50  # events one poll (or one push or webhook read) answers when maxEvents is absent
EVENTS_MAX_EVENTS = 100  # maxEvents at most: one answer stays small (a few hundred bytes an event)
EVENTS_POLL_TIMEOUT_MAX_MS = int(LONG_POLL_MAX_SECONDS * 1000)  # timeoutMs at most: under every proxy's idle timeout
EVENTS_RECHECK_SECONDS = 1.0  # a held poll or a push stream reads again this often (one indexed read each)
EVENTS_HEARTBEAT_SECONDS = (
    15.0  # notifications/events/heartbeat on a quiet push stream (the sketch: at least every 30 s)
)
EVENTS_READY_INTERVAL_SECONDS = 5.0  # todo.ready: at most one event per queue per this many seconds
EVENTS_NEXT_POLL_MS = 1000  # nextPollMs: the sketch's client floor; a held poll already waited
EVENTS_MAX_TODOS_ARGUMENT = 100  # ids one todo.finished subscription may name (as a wait's for.todos)
EVENTS_WEBHOOK_TTL_MIN_SECONDS = 60  # a webhook subscription's TTL is clamped up to this (no refresh storms)
EVENTS_WEBHOOK_TTL_DEFAULT_SECONDS = 3600  # granted when ttlMs is absent
# After a refresh replaces a subscription's secret, its deliveries carry signatures under the new and the old
# secret for this long (the sketch's dual-signing grace window): in-flight deliveries and a receiver that has
# not switched yet still verify. It spans a delivery's retries at the defaults (about 20 minutes).
EVENTS_SECRET_ROTATION_GRACE_SECONDS = 1800


def events_max_subscriptions_per_agent() -> int:
    """Webhook subscriptions one agent may hold (EVENTS_MAX_SUBSCRIPTIONS_PER_AGENT, default 20): each is read
    by the notify sidecar every round; -32013 beyond."""
    return int(settings.EVENTS_MAX_SUBSCRIPTIONS_PER_AGENT)


def events_webhook_ttl_max_seconds() -> int:
    """The longest webhook subscription TTL granted (EVENTS_WEBHOOK_TTL_MAX_SECONDS, default a day: the sketch's
    recommended ceiling). ``ttlMs: null`` (no expiry) is granted this too: finite, as the sketch allows."""
    return int(settings.EVENTS_WEBHOOK_TTL_MAX_SECONDS)


def events_suspend_after_failures() -> int:
    """Consecutive failed delivery attempts to a webhook subscription after which the sidecar suspends it
    (EVENTS_SUSPEND_AFTER_FAILURES, default 10; 0: never): no new events are enqueued for it (its cursor
    waits) until a refresh reactivates it; ``deliveryStatus`` says why (``lastError``, ``failedSince``)."""
    return max(0, int(settings.EVENTS_SUSPEND_AFTER_FAILURES))


def events_retention_seconds() -> int:
    """How far back a cursor may replay (EVENTS_RETENTION_SECONDS, default a day): an older cursor resumes
    from this floor with ``truncated: true``. Finished todos purged by retention are not replayed at all."""
    return int(settings.EVENTS_RETENTION_SECONDS)
