"""Hooks that tests use to break a real server on purpose. Routed only when the test settings turn
TEST_HOOKS on (switchboard/urls.py); production settings cannot.

``POST /_test/stall/loop`` blocks this process's event loop, ``/_test/stall/pool`` occupies every
thread of its pool (switchboard/executor.py), for ``?seconds=`` (default 60): the watchdog must find
the process stuck and end it (switchboard/watchdog.py). ``GET /_test/busy?seconds=`` is a slow request
that finishes: a sync view, in the pool as every request is, that takes that long (default 1 s); a flood
of them saturates the pool with work that moves, which the watchdog must not take for a stuck process.
"""

from __future__ import annotations

import asyncio
import time

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from switchboard import executor


@csrf_exempt
async def stall(request: HttpRequest, what: str) -> HttpResponse:
    seconds = float(request.GET.get("seconds", "60"))
    if what == "loop":
        time.sleep(seconds)  # on the loop, on purpose: nothing else in this process moves
    elif what == "pool":
        loop = asyncio.get_running_loop()
        for _ in range(settings.WEB_THREADS):
            loop.run_in_executor(executor.executor(), time.sleep, seconds)
    else:
        return JsonResponse({"error": {"code": "not_found", "detail": "loop or pool"}}, status=404)
    return JsonResponse({"stalled": what, "seconds": seconds}, status=202)


@csrf_exempt
def busy(request: HttpRequest) -> HttpResponse:
    seconds = float(request.GET.get("seconds", "1"))
    time.sleep(seconds)
    return JsonResponse({"busy": seconds})
