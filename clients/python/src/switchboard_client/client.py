"""``Client`` and ``AsyncClient``: the verbs of ``_api`` sent over httpx, with typed answers, exceptions
named for the API's error codes, and jittered retries where resending is safe (``_api.Retry``)."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from switchboard_client import _api
from switchboard_client._api import Call, Retry
from switchboard_client.errors import (
    ServerError,
    ServerUnreachable,
    SwitchboardError,
    Throttled,
    Unavailable,
    from_response,
)
from switchboard_client.models import EventSummary, Page, Todo

__version__ = "0.1.0"
DEFAULT_URL = "http://127.0.0.1:8000"

P = ParamSpec("P")
T = TypeVar("T")

# Errors that prove the request never reached the server: resending is always safe.
_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class _Base:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
    ) -> None:
        self.url = (url or os.environ.get("SWITCHBOARD_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("SWITCHBOARD_TOKEN")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff

    def _options(self) -> dict[str, Any]:
        headers = {"User-Agent": f"switchboard-client/{__version__}", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return {"base_url": self.url + "/api/v1/", "headers": headers, "timeout": self.timeout}

    def _request(self, call: Call[Any]) -> dict[str, Any]:
        options: dict[str, Any] = {"params": dict(call.params)}
        if call.body is not _api.NO_BODY:
            options["json"] = call.body
        if call.wait:
            options["timeout"] = self.timeout + call.wait
        return options

    def _answer(self, call: Call[T], response: httpx.Response) -> T:
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.is_success:
            if data is None:
                raise ServerError(f"{response.status_code} answer without JSON", status=response.status_code)
            return call.parse(data)
        if response.status_code in (502, 504) and data is None:  # a proxy in front of a server that is down
            raise Unavailable(f"{response.status_code} from a proxy: the server is down", status=response.status_code)
        raise from_response(response.status_code, data)

    def _unreachable(self, exc: httpx.TransportError) -> ServerUnreachable:
        return ServerUnreachable(f"cannot reach {self.url} ({exc.__class__.__name__}: {exc or 'no answer'})")

    def _should_retry(self, call: Call[Any], error: SwitchboardError, cause: Exception | None, attempt: int) -> bool:
        if attempt >= self.retries:
            return False
        if isinstance(cause, _UNSENT):
            return True
        if isinstance(error, ServerUnreachable):
            return call.retry is Retry.IDEMPOTENT
        if isinstance(error, Throttled):  # refused before anything was done
            return True
        return isinstance(error, Unavailable) and call.retry is not Retry.UNSENT_ONLY

    def _delay(self, attempt: int) -> float:
        # Full jitter (AWS's "exponential backoff and jitter"): retries of many clients spread out.
        return random.uniform(0, min(self.max_backoff, self.backoff * 2**attempt))  # noqa: S311 (not crypto)


def _sync(builder: Callable[P, Call[T]]) -> Callable[Concatenate[Client, P], T]:
    def verb(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.send(builder(*args, **kwargs))

    verb.__name__, verb.__doc__ = builder.__name__, builder.__doc__
    return verb


def _async(builder: Callable[P, Call[T]]) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    async def verb(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.send(builder(*args, **kwargs))

    verb.__name__, verb.__doc__ = builder.__name__, builder.__doc__
    return verb


class Client(_Base):
    """Switchboard's REST API. ``url`` and ``token`` default to SWITCHBOARD_URL and SWITCHBOARD_TOKEN.

    Thread-safe (one connection pool); use it as a context manager or call ``close()``."""

    def __init__(self, url: str | None = None, token: str | None = None, **options: Any) -> None:
        super().__init__(url, token, **options)
        self._http = httpx.Client(**self._options())

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def send(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            cause: Exception | None = None
            error: SwitchboardError
            try:
                response = self._http.request(call.method, call.path, **self._request(call))
                return self._answer(call, response)
            except httpx.TransportError as exc:
                cause, error = exc, self._unreachable(exc)
            except Unavailable as exc:
                error = exc
            if not self._should_retry(call, error, cause, attempt):
                raise error from cause
            time.sleep(self._delay(attempt))
            attempt += 1

    create = _sync(_api.create)
    create_many = _sync(_api.create_many)
    get = _sync(_api.get)
    list_todos = _sync(_api.list_todos)
    tree = _sync(_api.tree)
    set_priority = _sync(_api.set_priority)
    run_now = _sync(_api.run_now)
    claim = _sync(_api.claim)
    claim_one = _sync(_api.claim_one)
    heartbeat = _sync(_api.heartbeat)
    complete = _sync(_api.complete)
    complete_many = _sync(_api.complete_many)
    fail = _sync(_api.fail)
    release = _sync(_api.release)
    retry = _sync(_api.retry)
    wait = _sync(_api.wait)
    resolve = _sync(_api.resolve)
    resolve_waitpoint = _sync(_api.resolve_waitpoint)
    cancel = _sync(_api.cancel)
    set_budget = _sync(_api.set_budget)
    explain = _sync(_api.explain)
    explain_claims = _sync(_api.explain_claims)
    queues = _sync(_api.queues)
    queue = _sync(_api.queue)
    set_limits = _sync(_api.set_limits)
    limit = _sync(_api.limit)
    put_limit = _sync(_api.put_limit)
    delete_limit = _sync(_api.delete_limit)
    unpark = _sync(_api.unpark)
    pause = _sync(_api.pause)
    resume = _sync(_api.resume)
    schedules = _sync(_api.schedules)
    list_events = _sync(_api.list_events)
    event = _sync(_api.event)
    replay = _sync(_api.replay)

    def iter_todos(self, **filters: Any) -> Iterator[Todo]:
        """Every todo matching ``list_todos``'s filters, newest first, page after page."""
        cursor = None
        while True:
            page: Page[Todo] = self.list_todos(**filters, cursor=cursor)
            yield from page.items
            if not (cursor := page.next_cursor):
                return

    def iter_events(self, **filters: Any) -> Iterator[EventSummary]:
        cursor = None
        while True:
            page: Page[EventSummary] = self.list_events(**filters, cursor=cursor)
            yield from page.items
            if not (cursor := page.next_cursor):
                return


class AsyncClient(_Base):
    """``Client``'s verbs as coroutines (httpx.AsyncClient); one per event loop."""

    def __init__(self, url: str | None = None, token: str | None = None, **options: Any) -> None:
        super().__init__(url, token, **options)
        self._http = httpx.AsyncClient(**self._options())

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def send(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            cause: Exception | None = None
            error: SwitchboardError
            try:
                response = await self._http.request(call.method, call.path, **self._request(call))
                return self._answer(call, response)
            except httpx.TransportError as exc:
                cause, error = exc, self._unreachable(exc)
            except Unavailable as exc:
                error = exc
            if not self._should_retry(call, error, cause, attempt):
                raise error from cause
            await asyncio.sleep(self._delay(attempt))
            attempt += 1

    create = _async(_api.create)
    create_many = _async(_api.create_many)
    get = _async(_api.get)
    list_todos = _async(_api.list_todos)
    tree = _async(_api.tree)
    set_priority = _async(_api.set_priority)
    run_now = _async(_api.run_now)
    claim = _async(_api.claim)
    claim_one = _async(_api.claim_one)
    heartbeat = _async(_api.heartbeat)
    complete = _async(_api.complete)
    complete_many = _async(_api.complete_many)
    fail = _async(_api.fail)
    release = _async(_api.release)
    retry = _async(_api.retry)
    wait = _async(_api.wait)
    resolve = _async(_api.resolve)
    resolve_waitpoint = _async(_api.resolve_waitpoint)
    cancel = _async(_api.cancel)
    set_budget = _async(_api.set_budget)
    explain = _async(_api.explain)
    explain_claims = _async(_api.explain_claims)
    queues = _async(_api.queues)
    queue = _async(_api.queue)
    set_limits = _async(_api.set_limits)
    limit = _async(_api.limit)
    put_limit = _async(_api.put_limit)
    delete_limit = _async(_api.delete_limit)
    unpark = _async(_api.unpark)
    pause = _async(_api.pause)
    resume = _async(_api.resume)
    schedules = _async(_api.schedules)
    list_events = _async(_api.list_events)
    event = _async(_api.event)
    replay = _async(_api.replay)

    async def iter_todos(self, **filters: Any) -> AsyncIterator[Todo]:
        cursor = None
        while True:
            page: Page[Todo] = await self.list_todos(**filters, cursor=cursor)
            for todo in page.items:
                yield todo
            if not (cursor := page.next_cursor):
                return

    async def iter_events(self, **filters: Any) -> AsyncIterator[EventSummary]:
        cursor = None
        while True:
            page: Page[EventSummary] = await self.list_events(**filters, cursor=cursor)
            for event in page.items:
                yield event
            if not (cursor := page.next_cursor):
                return
