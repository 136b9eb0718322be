"""OpenAPI pieces for drf-spectacular: the Bearer security scheme, the error responses every endpoint
documents, and one example per endpoint."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiExample, OpenApiResponse

from todos.api.serializers import ErrorSerializer


# drf-spectacular registers extensions in an untyped __init_subclass__.
class BearerTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "todos.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An agent's token from `manage.py create_agent` (shown once; only its hash is stored).",
        }


_ERRORS = {
    400: ("invalid", "The input is invalid; `fields` holds the messages per field.", {"limit": ["too large"]}),
    401: ("unauthorized", "No token, an unknown token, or an inactive agent.", None),
    403: ("forbidden", "Retrying dead-letters without the right, or claiming queues outside the scopes.", None),
    404: ("not_found", "No such todo in the caller's scopes.", None),
    409: ("conflict", "The todo exists but is not in a state (or lease) that allows this.", None),
    413: ("too_large", "The request body or a JSON value is over its size limit.", None),
    429: ("throttled", "Over a per-agent budget; `limit` names it.", None),
    503: ("unavailable", "The database is unavailable, or timed out (code `timeout`); retry shortly.", None),
}


def _error_example(status: int) -> OpenApiExample:
    code, detail, fields = _ERRORS[status]
    body: dict[str, Any] = {"code": code, "detail": detail}
    if fields:
        body["fields"] = fields
    if status == 409:
        body["state"] = "done"
        body["dead_letter"] = False
    return OpenApiExample(code, value={"error": body}, response_only=True, status_codes=[str(status)])


def documented(ok: Any, errors: tuple[int, ...], examples: list[OpenApiExample]) -> dict[str, Any]:
    """extend_schema's ``responses`` and ``examples`` for an operation: the success response(s) (a
    serializer, or {status: serializer}), the listed error statuses plus 503 in the one error shape,
    and an example for each of them."""
    responses: dict[int, Any] = dict(ok) if isinstance(ok, dict) else {200: ok}
    for status in (*errors, 503):
        responses[status] = OpenApiResponse(ErrorSerializer, description=_ERRORS[status][1])
    return {"responses": responses, "examples": [*examples, *(_error_example(s) for s in (*errors, 503))]}


_TODO: dict[str, Any] = {
    "id": "td_6f1c2d0e9a7b4c3d8e5f60718293a4b5",
    "queue": "github.pulls",
    "source": "github",
    "kind": "review",
    "title": "Review PR #42",
    "payload": {"pr": 42},
    "event": None,
    "idempotency_key": "pr-42",
    "assignee": None,
    "state": "claimed",
    "dead_letter": False,
    "owner": "reviewer/host-1",
    "lease_id": "ls_0a1b2c3d4e5f60718293a4b5c6d7e8f9",
    "lease_expires_at": "2026-01-01T12:05:00Z",
    "attempt": 1,
    "max_attempts": 5,
    "next_retry_at": None,
    "run_at": "2026-01-01T12:00:00Z",
    "priority": 0,
    "result": None,
    "errors": [],
    "created_at": "2026-01-01T12:00:00Z",
    "updated_at": "2026-01-01T12:00:01Z",
    "claimed_at": "2026-01-01T12:00:01Z",
    "completed_at": None,
    "on_dependency_failure": "cancel",
    "dependencies": [],
    "waiting_for": None,
    "resolution": None,
    "parent_id": None,
    "root_id": "td_6f1c2d0e9a7b4c3d8e5f60718293a4b5",
    "depth": 0,
}
_PENDING = {**_TODO, "state": "pending", "owner": None, "lease_id": None, "lease_expires_at": None, "attempt": 0}
_DONE = {**_TODO, "state": "done", "lease_id": None, "lease_expires_at": None, "result": {"approved": True}}
_FAILED = {
    **_TODO,
    "state": "failed",
    "lease_id": None,
    "lease_expires_at": None,
    "next_retry_at": "2026-01-01T12:00:31Z",
    "errors": [{"attempt": 1, "at": "2026-01-01T12:00:21Z", "error": "timeout talking to GitHub"}],
}
_SCHEDULED = {**_PENDING, "state": "scheduled", "run_at": "2026-01-02T09:00:00Z", "priority": -10}
_LEASE = {"lease_id": _TODO["lease_id"]}
_CANCELLED = {
    **_TODO,
    "state": "cancelled",
    "lease_id": None,
    "lease_expires_at": None,
    "completed_at": "2026-01-01T12:01:00Z",
    "errors": [
        {
            "attempt": 1,
            "at": "2026-01-01T12:01:00Z",
            "error": "cancelled",
            "cancelled_by": "staff:ops",
            "reason": "duplicate PR",
            "was": "claimed",
            "owner": "reviewer/host-1",
        }
    ],
}


def _req(value: dict[str, Any], name: str = "request") -> OpenApiExample:
    return OpenApiExample(name, value=value, request_only=True)


def _res(value: Any, name: str = "response", status: int = 200) -> OpenApiExample:
    return OpenApiExample(name, value=value, response_only=True, status_codes=[str(status)])


CREATE_EXAMPLES = [
    _req(
        {
            "queue": "github.pulls",
            "kind": "review",
            "title": "Review PR #42",
            "payload": {"pr": 42},
            "idempotency_key": "pr-42",
        }
    ),
    _req(
        {
            "queue": "reports",
            "kind": "digest",
            "payload": {"day": "2026-01-01"},
            "run_at": "2026-01-02T09:00:00Z",
            "priority": -10,
        },
        "scheduled request",
    ),
    _res({**_PENDING, "created": True}, "created", 201),
    _res({**_PENDING, "created": False}, "existing", 200),
    _res({**_SCHEDULED, "created": True}, "scheduled", 201),
]
BATCH_CREATE_EXAMPLES = [
    _req(
        {
            "todos": [
                {"queue": "github.checks", "kind": "lint", "payload": {"pr": 42}, "idempotency_key": "pr-42-lint"},
                {"queue": "github.checks", "kind": "test", "payload": {"pr": 42}, "idempotency_key": "pr-42-test"},
                {
                    "queue": "github.pulls",
                    "kind": "merge",
                    "depends_on_index": [0, 1],
                    "idempotency_key": "pr-42-merge",
                },
            ]
        }
    ),
    _res(
        {
            "outcomes": [
                {"status": 201, "id": "td_0c1d2e3f405162738495a6b7c8d9e0f1", "state": "pending"},
                {"status": 200, "id": _TODO["id"], "state": "claimed"},
                {"status": 201, "id": "td_9a8b7c6d5e4f30211203948576a0b1c2", "state": "waiting"},
            ]
        }
    ),
]
PATCH_EXAMPLES = [_req({"priority": -50}), _res({**_PENDING, "priority": -50})]
RUN_NOW_EXAMPLES = [_res({**_PENDING, "run_at": "2026-01-01T12:00:07Z"})]
SCHEDULE_EXAMPLES = [
    _res(
        {
            "schedules": [
                {
                    "name": "nightly-digest",
                    "cron": "30 2 * * *",
                    "timezone": "Europe/Berlin",
                    "queue": "reports",
                    "kind": "digest",
                    "title": "Nightly digest",
                    "payload": {},
                    "priority": 0,
                    "max_attempts": None,
                    "active": True,
                    "catch_up": "latest",
                    "last_tick_at": "2026-01-01T01:30:00Z",
                    "next_run_at": "2026-01-02T01:30:00Z",
                    "last_todo": "td_6f1c2d0e9a7b4c3d8e5f60718293a4b5",
                    "last_error": "",
                    "created_at": "2025-12-01T10:00:00Z",
                }
            ]
        }
    )
]
TODO_LIST_EXAMPLES = [
    _res({"next": "https://switchboard.example/api/v1/todos/?cursor=cD0yMDI2", "previous": None, "results": [_PENDING]})
]
TODO_EXAMPLES = [_res(_TODO)]
_NODE = {"dead_letter": False, "queue": "github.pulls", "kind": "review"}
TREE_EXAMPLES = [
    _res(
        {
            "nodes": [
                {**_NODE, "id": _TODO["id"], "parent_id": None, "depth": 0, "state": "claimed", "title": "Review #42"},
                {
                    **_NODE,
                    "id": "td_0a9b8c7d6e5f40312a3b4c5d6e7f8091",
                    "parent_id": _TODO["id"],
                    "depth": 1,
                    "state": "pending",
                    "title": "Review src/queue.py",
                },
            ],
            "next": None,
            "truncated": False,
            "tree_usage": {"tokens_in": 12000, "cost_usd": 0.84},
            "budget": {"cost_usd": 5},
            "budget_exhausted": False,
        }
    )
]
CLAIM_NEXT_EXAMPLES = [
    _req({"queues": ["github.*"], "lease_seconds": 300, "limit": 1, "wait_seconds": 20, "worker": "host-1"}),
    _res({"todos": [_TODO]}),
]
CLAIM_ONE_EXAMPLES = [_req({"lease_seconds": 300, "worker": "host-1"}), _res(_TODO)]
RECEIPT_EXAMPLES = [_req({**_LEASE, "lease_seconds": 300}), _res(_TODO)]
RELEASE_EXAMPLES = [_req(_LEASE), _res(_PENDING)]
COMPLETE_EXAMPLES = [_req({**_LEASE, "result": {"approved": True}}), _res(_DONE)]
FAIL_EXAMPLES = [_req({**_LEASE, "error": "timeout talking to GitHub", "retry_in_seconds": 10}), _res(_FAILED)]
_WAITING = {
    **_PENDING,
    "state": "waiting",
    "owner": "reviewer/host-1",
    "waiting_for": {"event": {"source": "github", "type": "check_suite", "match": {"check_suite.head_sha": "4f2a"}}},
}
WAIT_EXAMPLES = [
    _req(
        {
            **_LEASE,
            "for": {"event": {"source": "github", "type": "check_suite", "match": {"check_suite.head_sha": "4f2a"}}},
            "timeout_seconds": 3600,
            "on_timeout": "pending",
        },
        "an event",
    ),
    _res(_WAITING, "waiting for the event"),
    _req({**_LEASE, "for": {"token": True}, "timeout_seconds": 86400, "resolvers": ["release-manager"]}, "a token"),
    _res(
        {
            **_WAITING,
            "waiting_for": {"token": True},
            "waitpoint": {
                "token": "wpt_Qm9vZ2llV29vZ2llQm9vZ2llV29vZ2ll",
                "resolve_url": "https://switchboard.example/api/v1/waitpoints/wpt_Qm9vZ2llV29vZ2llQm9vZ2llV29vZ2ll/resolve/",
            },
        },
        "the token, shown once",
    ),
]
RESOLVE_EXAMPLES = [
    _req({"data": {"approved": True}}),
    _res(
        {
            **_PENDING,
            "owner": "reviewer/host-1",
            "resolution": {
                "by": "agent",
                "at": "2026-01-01T12:30:00Z",
                "data": {"approved": True},
                "resolved_by": "release-manager",
            },
        }
    ),
]
WAITPOINT_RESOLVE_EXAMPLES = [
    _req({"token": "wpt_Qm9vZ2llV29vZ2llQm9vZ2llV29vZ2ll", "data": {"approved": True, "by": "jo"}}),
    _res({"resolved": True}),
]
CANCEL_EXAMPLES = [_req({"reason": "duplicate PR"}), _res(_CANCELLED)]
QUEUE_CONTROL_EXAMPLES = [
    _req({"max_claimed": 3, "rate_per_second": 20, "rate_burst": 5}),
    _res({"queue": "github.pulls", "paused": False, "max_claimed": 3, "rate_per_second": 20.0, "rate_burst": 5}),
]
RETRY_EXAMPLES = [_req({"mode": "once", "note": "GitHub was down"}), _res(_PENDING)]
BATCH_EXAMPLES = [
    _req({"items": [{"id": _TODO["id"], **_LEASE, "result": {"approved": True}}]}),
    _res(
        {
            "outcomes": [
                {"id": _TODO["id"], "status": 200, "todo": _DONE},
                {
                    "id": "td_00000000000000000000000000000000",
                    "status": 404,
                    "error": {"code": "not_found", "detail": "No todo td_00000000000000000000000000000000."},
                },
            ]
        }
    ),
]
QUEUE_EXAMPLES = [
    _res(
        {
            "queues": [
                {
                    "queue": "github.pulls",
                    "pending": 12,
                    "claimed": 3,
                    "failed": 2,
                    "retry_waiting": 1,
                    "dead_letters": 1,
                    "scheduled": 40,
                    "waiting": 2,
                    "oldest_pending_age_seconds": 4.2,
                    "cancelled": 0,
                    "paused": False,
                    "max_claimed": 3,
                    "rate_per_second": None,
                    "rate_burst": None,
                }
            ]
        }
    )
]
