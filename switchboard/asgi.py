"""The ASGI entry point: Django's ASGI handler, plus any ASGI apps mounted by path (settings.ASGI_MOUNTS).

Mounts are named by dotted path in the settings, so the shell imports no app: an app that serves its
own ASGI protocol (the MCP endpoint) registers it there. Lifespan events are answered here and passed
to each mount that has ``startup``/``shutdown`` coroutines.
"""

from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")

django_application = get_asgi_application()

from django.conf import settings  # noqa: E402  (after the app registry is ready)
from django.utils.module_loading import import_string  # noqa: E402

_mounts: list[tuple[str, Any]] = [
    (prefix.rstrip("/"), import_string(path)) for prefix, path in getattr(settings, "ASGI_MOUNTS", {}).items()
]


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            for _, app in _mounts:
                if hasattr(app, "startup"):
                    await app.startup()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            for _, app in _mounts:
                if hasattr(app, "shutdown"):
                    await app.shutdown()
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
