"""The bare ceiling for the request path: a minimal ASGI app under the same server (gunicorn +
uvicorn workers) that answers the same two requests as Switchboard's claim+complete with the same
two statements (todos/sql's CLAIM_NEXT and COMPLETE, prepared), and nothing else: no Django, no
token lookup, no validation, no logging or metrics. bench/http/request_path.py runs it.

    CEILING_DSN=postgresql://... gunicorn bench.http.ceiling_app:app -c gunicorn.conf.py
"""

from __future__ import annotations

import json
import os
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from todos import sql

_conn: psycopg.Connection[Any] | None = None
_LEASE_ID = [c.strip() for c in sql.TODO_COLUMNS.split(",")].index("lease_id")
_CLAIM = {"scopes": ["%"], "wanted": ["%"], "agent": "bench", "owner": "bench", "limit": 1, "lease_seconds": 60.0}


def _db() -> psycopg.Connection[Any]:
    global _conn
    if _conn is None or _conn.closed:
        _conn = psycopg.connect(os.environ["CEILING_DSN"], autocommit=True, prepare_threshold=0)
    return _conn


async def _body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    raw = await _body(receive)
    path: str = scope["path"]
    if path == "/readyz":  # bench/harness.py's gunicorn() waits for it
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})
        return
    # One statement, run inline: the ceiling has nothing else to do meanwhile.
    if path.endswith("/todos/claim/"):
        rows = _db().execute(sql.CLAIM_NEXT, _CLAIM).fetchall()
        out: Any = {"todos": [{"id": r[0], "lease_id": r[_LEASE_ID]} for r in rows]}
    else:
        todo_id = path.rstrip("/").split("/")[-2]
        params = {"id": todo_id, "lease_id": json.loads(raw)["lease_id"], "agent": "bench", "visible": ["%"]}
        rows = _db().execute(sql.COMPLETE, {**params, "result": Jsonb(None)}).fetchall()
        out = {"id": todo_id, "state": "done" if rows else "missed"}
    body = json.dumps(out).encode()
    status = 200 if rows or "todos" in out else 409
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})
