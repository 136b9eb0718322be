"""Exceptions named for the API's error codes (``{"error": {"code", "detail", ...}}``). Catch
``SwitchboardError`` for all of them; each carries the code's extra fields."""

from __future__ import annotations

from typing import Any


class SwitchboardError(Exception):
    """An answer that is not a success, or no answer at all."""

    code: str = "error"

    def __init__(self, detail: str, *, status: int | None = None, body: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        #: The error object as the server sent it (``{}`` when there was no answer).
        self.body: dict[str, Any] = body or {}

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}" if self.status is None else f"{self.status} {self.code}: {self.detail}"


class Invalid(SwitchboardError):
    """400: the request was refused before anything changed; ``fields`` maps each field to its messages."""

    code = "invalid"

    @property
    def fields(self) -> dict[str, list[str]]:
        return dict(self.body.get("fields") or {})

    def __str__(self) -> str:
        named = "; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in self.fields.items())
        return f"{super().__str__()} ({named})" if named else super().__str__()


class Unauthorized(SwitchboardError):
    """401: no token, or a token the server does not know (revoked, mistyped, another server's)."""

    code = "unauthorized"


class Forbidden(SwitchboardError):
    """403: the token's agent may not do this; ``queues`` lists the claim's queues outside its scopes."""

    code = "forbidden"

    @property
    def queues(self) -> list[str]:
        return list(self.body.get("queues") or [])


class NotFound(SwitchboardError):
    """404: no such todo, queue or event, or one outside the caller's scopes (the same answer)."""

    code = "not_found"


class Conflict(SwitchboardError):
    """409: the transition's guard failed. ``state`` is the todo's current state: a stale lease (another
    worker has it), a cancelled todo, or one already finished."""

    code = "conflict"

    @property
    def state(self) -> str | None:
        state = self.body.get("state")
        return str(state) if state is not None else None

    @property
    def dead_letter(self) -> bool:
        return bool(self.body.get("dead_letter"))


class SpawnLimit(Conflict):
    """409 ``spawn_limit``: a create under a parent would pass one of its tree's spawn caps; ``limit`` names
    it (max_depth, max_children, max_descendants) and ``value`` is the cap. Nothing was created."""

    code = "spawn_limit"

    @property
    def limit(self) -> str | None:
        limit = self.body.get("limit")
        return str(limit) if limit is not None else None


class Superseded(Conflict):
    """409 ``superseded``: a newer todo replaced this one (a create with ``supersede``); its holder should stop
    working on it."""

    code = "superseded"


class TooLarge(SwitchboardError):
    """413: a payload or result over the server's MAX_PAYLOAD_BYTES."""

    code = "too_large"


class MethodNotAllowed(SwitchboardError):
    code = "method_not_allowed"


class Unavailable(SwitchboardError):
    """503: the server's database is unavailable. Retried with backoff where that is safe."""

    code = "unavailable"


class Timeout(Unavailable):
    """503 ``timeout``: a statement ran past the server's time limit and was rolled back."""

    code = "timeout"


class Throttled(Unavailable):
    """429: this agent is over one of its budgets on the server (``limit`` names it: open long-polls and
    awaits, the request rate, open event waits). Nothing was done, so it is retried with backoff, whatever
    the call."""

    code = "throttled"

    @property
    def limit(self) -> str | None:
        limit = self.body.get("limit")
        return str(limit) if limit is not None else None


class ServerUnreachable(Unavailable):
    """No answer: the server is down, unreachable, or the connection broke mid-request."""

    code = "unreachable"


class ServerError(SwitchboardError):
    """500 (``internal``) or any answer this client cannot read."""

    code = "internal"


BY_CODE: dict[str, type[SwitchboardError]] = {
    cls.code: cls
    for cls in (
        Invalid,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        SpawnLimit,
        Superseded,
        TooLarge,
        MethodNotAllowed,
        Unavailable,
        Timeout,
        Throttled,
        ServerError,
    )
}
BY_STATUS: dict[int, type[SwitchboardError]] = {
    400: Invalid,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: TooLarge,
    429: Throttled,
    503: Unavailable,
}


def from_response(status: int, payload: Any) -> SwitchboardError:
    """The exception for an error answer: by its code, else by its status."""
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        cls = BY_STATUS.get(status, ServerError)
        return cls(f"HTTP {status} without an error body", status=status)
    code = str(error.get("code", ""))
    cls = BY_CODE.get(code) or BY_STATUS.get(status, ServerError)
    return cls(str(error.get("detail", "")), status=status, body=error)
