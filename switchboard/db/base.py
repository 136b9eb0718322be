"""Django's PostgreSQL backend with a health check that costs no round trip.

CONN_HEALTH_CHECKS probes a reused connection with ``SELECT 1`` before each request's first query:
a round trip per request, measured at about a seventh of a claim+complete over HTTP. An idle
connection has nothing to read unless the server closed it (a restart, pg_terminate_backend, an
idle timeout: the server then sends its error and EOF), so a readable socket is the sign to run the
real probe; a quiet one is taken as usable. A connection that breaks between the check and the
query still fails that one request with 503 (switchboard.api), as it would after a probe."""

from __future__ import annotations

import select

from django.db.backends.postgresql import base


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
