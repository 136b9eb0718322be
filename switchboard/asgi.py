"""The ASGI entry point: Django's ASGI handler, plus any ASGI apps mounted by path (settings.ASGI_MOUNTS).

Mounts are named by dotted path in the settings, so the shell imports no app: an app that serves its
own ASGI protocol (the MCP endpoint) registers it there. Lifespan events are answered here and passed
to each mount, and each object named in settings.ASGI_LIFESPAN, that has ``startup``/``shutdown``
coroutines.
"""

from __future__ import annotations

import os
from importlib import import_module
from typing import Any

import django
from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.http import HttpRequest, HttpResponseBase
from django.urls import Resolver404, resolve

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")


class SingleThreadASGIHandler(ASGIHandler):
    """Django's ASGI handler, with two changes that make it cheap.

    1. No per-request ThreadSensitiveContext. That context gives every request its own thread for
       sync code, and Django's connections are per thread: each request would open a database
       connection (and leave it to the garbage collector). Without it, a process's sync code (sync
       views, middleware, signals, the queue's statements run through sync_to_async) all runs in
       asgiref's one thread-sensitive thread, on one persistent connection that CONN_MAX_AGE and the
       request signals manage as under WSGI.
    2. A sync view runs with the whole middleware chain in one hop to that thread. Django's async
       chain adapts each sync-only middleware separately (about 16 thread hops a request, measured:
       most of a small request's cost); only an async view that will wait (its class's
       ``runs_async(request)`` says so, or it has no such method) takes the async chain.
    """

    def __init__(self) -> None:
        super().__init__()
        self._sync = BaseHandler()
        self._sync.load_middleware(is_async=False)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        await self.handle(scope, receive, send)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        if self._waits(request):
            return await super().get_response_async(request)
        response: HttpResponseBase = await sync_to_async(self._sync.get_response, thread_sensitive=True)(request)
        return response

    @staticmethod
    def _waits(request: HttpRequest) -> bool:
        try:
            match = resolve(request.path_info)
        except Resolver404:
            return False
        if not iscoroutinefunction(match.func):
            return False
        decide = getattr(getattr(match.func, "cls", None), "runs_async", None)
        return True if decide is None else bool(decide(request))


django.setup(set_prefix=False)
django_application = SingleThreadASGIHandler()

from django.conf import settings  # noqa: E402  (after the app registry is ready)
from django.utils.module_loading import import_string  # noqa: E402

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
    path = scope.get("path", "")
    for prefix, app in _mounts:
        if path == prefix or path.startswith(prefix + "/"):
            await app(scope, receive, send)
            return
    await django_application(scope, receive, send)
