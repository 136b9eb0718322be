"""Enqueue N no-op jobs through an alternative's own API, in one transaction so they all become
visible to the already-running workers at the same instant. Prints {"n", "seconds"} as JSON.

    DJANGO_SETTINGS_MODULE=bench.compare.alt_settings.procrastinate DATABASE_URL=... \
        python -m bench.compare.alt_enqueue procrastinate 1000
"""

from __future__ import annotations

import json
import os
import sys
import time

from bench import harness as h


def main() -> None:
    which, n = sys.argv[1], int(sys.argv[2])
    h.setup_django(os.environ["DATABASE_URL"], os.environ["DJANGO_SETTINGS_MODULE"])
    from django.db import transaction

    if which == "procrastinate":
        from bench.compare.alt_settings.procrastinate_tasks import noop

        enqueue = noop.defer
    elif which == "django_tasks":
        from bench.compare.alt_settings.django_tasks_jobs import noop

        enqueue = noop.enqueue
    else:
        raise SystemExit(f"unknown alternative {which!r}")
    with transaction.atomic():
        enqueue()  # warm-up outside the timing (imports, first statement); drained like the rest
        started = time.perf_counter()
        for _ in range(n - 1):
            enqueue()
        seconds = time.perf_counter() - started
    print(json.dumps({"n": n - 1, "seconds": seconds}))


if __name__ == "__main__":
    main()
