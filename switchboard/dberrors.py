"""What a database error means for whoever hit it, decided in one place by its SQLSTATE (never by its
text): the API's answers (switchboard/api.py, MCP, ingest), the statement runner's one retry
(todos/rows.py), the reaper's and the listener's logs all read it here.

- ``UNAVAILABLE``: the database cannot be reached or is going away (class 08, shutdown, too many
  connections, a connection attempt that failed, a connection that was lost). Retry later; 503
  ``unavailable``.
- ``CONTENTION``: a deadlock or a serialization failure aborted the statement. Running the same work
  again at once usually succeeds: a single statement outside a transaction is retried once
  (``retrying_once``); otherwise 503.
- ``TIMEOUT``: a statement, lock or idle timeout (or a cancel). 503 ``timeout``.
- ``BROKEN``: everything else (bad data, a missing table, a refused password): running it again
  changes nothing. A request answers 500; the reaper exits after a few sweeps. Except a value the
  request itself carried that PostgreSQL refuses (a NUL byte, a number out of range: ``refused_value``),
  which the API answers 400 ``invalid``.

``describe`` gives the SQLSTATE and the server's primary message, never the statement or its
parameters, so it is safe to log.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import TypeVar

import psycopg
from django.db import DatabaseError, InterfaceError, connection

logger = logging.getLogger("switchboard.db")

T = TypeVar("T")


class Failure(enum.Enum):
    UNAVAILABLE = "unavailable"
    CONTENTION = "contention"
    TIMEOUT = "timeout"
    BROKEN = "broken"


_CONTENTION = {"40001", "40P01"}  # serialization_failure, deadlock_detected
# query_canceled (statement_timeout, a cancel), lock_not_available (lock_timeout),
# idle_in_transaction_session_timeout, transaction_timeout
_TIMEOUT = {"57014", "55P03", "25P03", "25P04"}
# admin_shutdown, crash_shutdown, cannot_connect_now (starting up, shutting down, in recovery)
_GOING_AWAY = {"57P01", "57P02", "57P03"}
# connection_exception; insufficient_resources (too many connections, disk full); system_error (I/O)
_UNAVAILABLE_CLASSES = {"08", "53", "58"}


def driver_error(exc: BaseException) -> psycopg.Error | None:
    """The psycopg error under ``exc`` (Django wraps it, as __cause__), if any."""
    if isinstance(exc, psycopg.Error):
        return exc
    cause = exc.__cause__
    return cause if isinstance(cause, psycopg.Error) else None


def sqlstate(exc: BaseException) -> str | None:
    pg = driver_error(exc)
    return pg.sqlstate if pg is not None else None


def constraint_name(exc: BaseException) -> str | None:
    """The constraint an IntegrityError violated, as the server names it."""
    pg = driver_error(exc)
    return pg.diag.constraint_name if pg is not None else None


def classify(exc: BaseException) -> Failure:
    """What ``exc`` (a Django DatabaseError or a psycopg.Error) means: see the module's docstring."""
    pg = driver_error(exc)
    state = pg.sqlstate if pg is not None else None
    if state is None:
        if pg is not None and pg.pgconn is not None:
            # A connection attempt failed (psycopg sets pgconn only then). libpq gives no SQLSTATE for
            # it; a server that asked for a password and refused ours will refuse it again.
            return Failure.BROKEN if pg.pgconn.needs_password or pg.pgconn.used_password else Failure.UNAVAILABLE
        if isinstance(pg or exc, InterfaceError | psycopg.InterfaceError | psycopg.OperationalError):
            return Failure.UNAVAILABLE  # the connection was lost or closed: no server answered
        return Failure.BROKEN
    if state in _CONTENTION:
        return Failure.CONTENTION
    if state in _TIMEOUT:
        return Failure.TIMEOUT
    if state in _GOING_AWAY or state[:2] in _UNAVAILABLE_CLASSES:
        return Failure.UNAVAILABLE
    return Failure.BROKEN


def describe(exc: BaseException) -> str:
    """``<class> SQLSTATE <code>: <server message>``, for the log. Without a SQLSTATE (a connection
    attempt or a lost connection), libpq's own message, which names the server but no statement."""
    pg = driver_error(exc)
    name = (pg or exc).__class__.__name__
    if pg is not None and pg.sqlstate is not None:
        return f"{name} SQLSTATE {pg.sqlstate}: {pg.diag.message_primary or ''}"
    text = str(pg or exc).strip().splitlines()
    return f"{name}: {' '.join(line.strip() for line in text)}" if text else name


def log_failure(log: logging.Logger, what: str, exc: BaseException) -> Failure:
    """Log ``<what> failed (<kind>): <describe(exc)>``: at ERROR when retrying cannot cure it, else
    WARNING. The reaper and the listener's reconnect loop say why they failed with it."""
    failure = classify(exc)
    level = logging.ERROR if failure is Failure.BROKEN else logging.WARNING
    log.log(level, "%s failed (%s): %s", what, failure.value, describe(exc))
    return failure


def retrying_once(run: Callable[[], T]) -> T:
    """Run ``run``; if a deadlock or serialization failure aborted it, run it once more. Only outside
    a transaction: inside one, the whole transaction was aborted and only its owner can start again."""
    try:
        return run()
    except DatabaseError as exc:
        if connection.in_atomic_block or classify(exc) is not Failure.CONTENTION:
            raise
        logger.warning("database contention, retrying once: %s", describe(exc))
    return run()


def error_answer(exc: BaseException) -> tuple[str, str] | None:
    """The API's answer to a database error, (code, detail), always a 503 with Retry-After (logged
    here); None for a BROKEN one, a bug or a misconfiguration that the caller reports as such."""
    failure = classify(exc)
    if failure is Failure.BROKEN:
        return None
    logger.warning("database %s: %s", failure.value, describe(exc))
    if failure is Failure.TIMEOUT:
        return "timeout", "The database did not answer in time; retry shortly."
    if failure is Failure.CONTENTION:
        return "unavailable", "The database aborted the work to resolve a conflict; retry shortly."
    return "unavailable", "The database is unavailable; retry shortly."


# The data exceptions (class 22) a request's own value causes: untranslatable_character (\u0000 or a lone
# surrogate in jsonb), character_not_in_repertoire, numeric_value_out_of_range, datetime_field_overflow.
# Not invalid_text_representation (22P02): a cast of the wrong text is as often our bug, and stays a 500.
_REFUSED_VALUE_STATES = {"22P05", "22021", "22003", "22008"}


def refused_value(exc: BaseException) -> bool:
    """A value the request carried that PostgreSQL cannot take: a NUL byte in text (psycopg refuses it
    before sending: a DataError with no SQLSTATE), or one of _REFUSED_VALUE_STATES. Bad input, not an
    outage: the API answers 400 rather than a 500 (logged, in case a check upstream is missing)."""
    pg = driver_error(exc)
    if isinstance(pg, psycopg.DataError) and (pg.sqlstate is None or pg.sqlstate in _REFUSED_VALUE_STATES):
        logger.warning("database refused a value: %s", describe(exc))
        return True
    return False
