"""Handlers the drills give the reference worker (examples/worker.py --handler module:function).

Each takes the todo (a dict from the API, or any object with an ``id``) and returns a JSON-able
result. ``record`` appends one line per processing to $DRILL_RECORD_FILE, so the drill can count
todos processed more than once; O_APPEND keeps concurrent writers' short lines whole.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any


def _todo_id(todo: Any) -> str:
    return str(todo["id"] if isinstance(todo, dict) else todo.id)


def record(todo: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Leaves a trace as the work starts, then works a little (so kills land mid-job): a todo whose
    worker is killed before it completes is recorded again when another worker takes it."""
    line = f"{_todo_id(todo)} {os.getpid()}\n".encode()
    fd = os.open(os.environ["DRILL_RECORD_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    time.sleep(float(os.environ.get("DRILL_HANDLER_SECONDS", "0.05")))
    return {"processed_by": os.getpid()}


def crash(todo: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """A poison message: the worker process dies mid-job, every time."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def boom(todo: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """A poison message that raises instead: the worker reports the failure."""
    raise RuntimeError(f"poison todo {_todo_id(todo)}: handler always raises")
