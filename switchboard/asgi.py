"""The ASGI entry point: Django's ASGI handler, plus any ASGI apps mounted by path (settings.ASGI_MOUNTS).

Every request's body is bounded here, outside both, before anything reads it (switchboard/body_limit.py);
a mounted app gets what Django's middleware gives Django's requests (switchboard/mounted.py).

Mounts are named by dotted path in the settings, so the shell imports no app: an app that serves its
own ASGI protocol (the MCP endpoint) registers it there. Lifespan events are answered here and passed
to each mount, and each object named in settings.ASGI_LIFESPAN, that has ``startup``/``shutdown``
coroutines.
"""

from __future__ import annotations

import asyncio
import functools
import os
from importlib import import_module
from typing import Any

import django
from asgiref.sync import iscoroutinefunction
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import FileResponse, HttpRequest, HttpResponseBase
from django.urls import Resolver404, ResolverMatch, resolve, set_script_prefix

from switchboard import executor

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")


class PooledASGIHandler(ASGIHandler):
    """Django's ASGI handler, with sync and async requests kept apart so that neither can wait for the other.

    - A sync view runs with the whole sync middleware chain, and Django's request_started and
      request_finished signals, in one hop to the process's bounded pool of threads
      (switchboard/executor.py), on that thread's persistent connection. Django's async chain would
      adapt each sync-only middleware separately (about 16 thread hops a request, measured: most of a
      small request's cost).
    - An async view runs on the event loop through Django's async chain, and never through
      async_to_sync: its statements go to the same pool, one hop each. A view class can have both: a
      sync view for most requests, and an async ``waiting_view`` for the requests its
      ``runs_async(request)`` picks (a long-poll claim), so a plain claim pays one hop, not the async
      chain.

    Nothing in the pool waits for the loop and nothing on the loop blocks on the pool, so no request can
    wait for something that only a request it blocks could provide (issue 19's deadlock).
    """

    def __init__(self) -> None:
        # Django's ASGIHandler.__init__ would load Django's async chain; the chains are built here instead.
        BaseHandler.__init__(self)
        self._chains: dict[tuple[bool, bool], BaseHandler] = {
            (lean, is_async): _Chain(_middleware(lean), is_async)
            for lean in (False, True)
            for is_async in (False, True)
        }
        self._middleware_chain = self._chains[False, True]._middleware_chain  # type: ignore[attr-defined]  # Django's

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        loop = asyncio.get_running_loop()
        if not executor.serving(loop):  # no lifespan startup (a server run with --lifespan off)
            executor.serve(loop)
        await self.handle(scope, receive, send)

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is not None and "CONTENT_LENGTH" not in request.META:
            # A chunked body's length is known once it is spooled (switchboard/body_limit.py has bounded
            # it): declared, it meets Django's own DATA_UPLOAD_MAX_MEMORY_SIZE check and runs_async's.
            if size := body_file.seek(0, os.SEEK_END):
                request.META["CONTENT_LENGTH"] = str(size)
            body_file.seek(0)
        if request is None:
            assert error_response is not None
            body_file.close()
            await self.send_response(error_response, send)
            await executor.run_raw(error_response.close)
            return
        try:
            match, runs_async = self._match(request)
            # Resolved once: each chain's resolve_request gets this match (None: resolved there, a 404).
            request.resolver_match = match
            if not runs_async:
                response = await executor.run_raw(functools.partial(self._respond, request, scope))
                try:
                    await self.send_response(response, send)
                finally:
                    if response.streaming:  # closed after its body was sent
                        await executor.run_raw(response.close)
                return
            await self._handle_async(request, scope, receive, send)
        finally:
            body_file.close()

    def _respond(self, request: HttpRequest, scope: dict[str, Any]) -> HttpResponseBase:
        """The sync path, in a pool thread: Django's request cycle as under WSGI."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        response = self._chains[_lean(request), False].get_response(request)
        response._handler_class = self.__class__  # type: ignore[attr-defined]
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size
        if not response.streaming:
            # Its body is in memory: request_finished (which ages this thread's connection) runs here,
            # in the thread that used the connection.
            response.close()
        return response

    async def _handle_async(self, request: HttpRequest, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django's own handling of an async view: a client that disconnects cancels the view."""
        await signals.request_started.asend(sender=self.__class__, scope=scope)

        chain = self._chains[_lean(request), True]

        async def process_request() -> HttpResponseBase:
            response = await chain.get_response_async(request)
            response._handler_class = self.__class__  # type: ignore[attr-defined]
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client disconnected during send_response
            return response

        serving = asyncio.create_task(process_request())
        tasks: list[asyncio.Task[Any]] = [asyncio.create_task(self.listen_for_disconnect(receive)), serving]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
            else:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        try:
            response = serving.result()
        except asyncio.CancelledError:
            await signals.request_finished.asend(sender=self.__class__)
        else:
            await executor.run_raw(response.close)

    @staticmethod
    def _match(request: HttpRequest) -> tuple[ResolverMatch | None, bool]:
        """How ``request`` is served: its URL's match (None if none: the chain answers 404), with the view
        to call, and whether on the loop (else in the pool). A view class serves some requests on the
        loop by declaring ``waiting_view`` (a coroutine) and ``runs_async(request)`` (todos/api/views.py:
        the long-poll and the await)."""
        try:
            match = resolve(request.path_info)
        except Resolver404:
            return None, False
        cls = getattr(match.func, "cls", None)
        waiting_view = getattr(cls, "waiting_view", None)
        if waiting_view is not None:
            if not cls.runs_async(request):  # type: ignore[union-attr]
                return match, False
            match.func = waiting_view
            return match, True
        return match, iscoroutinefunction(match.func)


# Django's middleware whose hooks touch nothing but the request and the answer, served as subclasses that
# run those hooks on the loop in the async chain (switchboard/middleware.py): no thread hop each.
_ON_THE_LOOP = {
    "django.middleware.security.SecurityMiddleware": "switchboard.middleware.SecurityOnTheLoopMiddleware",
    "django.middleware.common.CommonMiddleware": "switchboard.middleware.CommonOnTheLoopMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware": "switchboard.middleware.XFrameOptionsOnTheLoopMiddleware",
}


def _middleware(lean: bool) -> list[str]:
    """settings.MIDDLEWARE as served: without SESSION_ONLY_MIDDLEWARE for the lean chain."""
    from django.conf import settings

    left_out = set(settings.SESSION_ONLY_MIDDLEWARE) if lean else set()
    return [_ON_THE_LOOP.get(path, path) for path in settings.MIDDLEWARE if path not in left_out]


def _lean(request: HttpRequest) -> bool:
    """Whether ``request`` takes the lean chain: an API request that carries a bearer token, which DRF's
    BearerTokenAuthentication answers or refuses before any session is asked (settings.SESSION_ONLY_MIDDLEWARE).
    The admin, the pages, ingest and a session's API call keep the whole chain."""
    return request.path_info.startswith("/api/") and request.META.get("HTTP_AUTHORIZATION", "")[:7].lower() == "bearer "


class _Chain(BaseHandler):
    """One middleware chain (sync or async) over ``paths``, resolving each URL once (handle() did)."""

    def __init__(self, paths: list[str], is_async: bool) -> None:
        super().__init__()
        from django.conf import settings

        # BaseHandler.load_middleware reads settings.MIDDLEWARE: given ``paths`` for the time it takes,
        # once, at start-up (the module's import), before any request.
        configured = settings.MIDDLEWARE
        settings.MIDDLEWARE = paths
        try:
            self.load_middleware(is_async=is_async)
        finally:
            settings.MIDDLEWARE = configured

    def resolve_request(self, request: HttpRequest) -> ResolverMatch:
        return request.resolver_match or super().resolve_request(request)


django.setup(set_prefix=False)
django_application = PooledASGIHandler()

from django.conf import settings  # noqa: E402  (after the app registry is ready)
from django.utils.module_loading import import_string  # noqa: E402

from switchboard import body_limit, mounted  # noqa: E402  (they import DRF, which needs the registry)

_mounts: list[tuple[str, Any]] = [
    (prefix.rstrip("/"), import_string(path)) for prefix, path in getattr(settings, "ASGI_MOUNTS", {}).items()
]
_lifespan_hooks: list[Any] = [app for _, app in _mounts] + [
    import_module(path) for path in getattr(settings, "ASGI_LIFESPAN", [])
]


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            for hook in _lifespan_hooks:
                if hasattr(hook, "startup"):
                    await hook.startup()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            for hook in _lifespan_hooks:
                if hasattr(hook, "shutdown"):
                    await hook.shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    loop = asyncio.get_running_loop()
    if not executor.serving(loop):  # no lifespan startup (a server run with --lifespan off)
        executor.serve(loop)
    await body_limit.bounded(_route, scope, receive, send)


async def _route(scope: dict[str, Any], receive: Any, send: Any) -> None:
    path = scope.get("path", "")
    for prefix, app in _mounts:
        if path == prefix or path.startswith(prefix + "/"):
            await mounted.serve(app, prefix.lstrip("/"), scope, receive, send)
            return
    await django_application(scope, receive, send)
