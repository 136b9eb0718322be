"""Django's PostgreSQL backend with a health check that costs no round trip.

CONN_HEALTH_CHECKS probes a reused connection with ``SELECT 1`` before each request's first query:
a round trip per request, measured at about a seventh of a claim+complete over HTTP. An idle
connection has nothing to read unless the server closed it (a restart, pg_terminate_backend, an
idle timeout: the server then sends its error and EOF), so a readable socket is the sign to run the
real probe; a quiet one is taken as usable. A connection that breaks between the check and the
query still fails that one request with 503 (switchboard.api), as it would after a probe.

psycopg turns a statement's ``%(name)s`` placeholders into ``$n`` once per statement text and keeps
the result (an LRU of 128 texts), but only for texts up to 4 KB: the queue's claim statements are 7-17
KB (todos/sql), so every claim parsed its text again, about a twentieth of a web process's CPU under a
claim+complete load (profiled in issue 32). ``STATEMENT_CACHE_BYTES`` raises that bound for this
process; the cache stays bounded by its 128 entries (a few MB at most)."""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg import _queries

STATEMENT_CACHE_BYTES = 64 * 1024
_queries.MAX_CACHED_STATEMENT_LENGTH = max(_queries.MAX_CACHED_STATEMENT_LENGTH, STATEMENT_CACHE_BYTES)


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        conn = self.connection
        if conn is None or conn.closed:
            return False
        try:
            readable, _, _ = select.select([conn.fileno()], [], [], 0)
        except (OSError, ValueError):
            return False
        return True if not readable else bool(super().is_usable())
