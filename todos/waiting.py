"""TEMPORARY SHIM (issue 14's branch only): the async helper's issue 10 replaces this whole module at merge
with the real ``claim_next_waiting``, which waits on the process's LISTEN connection with no thread and no
database connection held. The signature below is that one's; callers (todos/mcp/) need no change.

Until then a waiting claim runs todos.listen's blocking long-poll in a worker thread of its own
(``thread_sensitive=False``), so it does not queue behind every other sync call of the process."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from todos import listen
from todos.models import Agent, Todo


def _claim_blocking(
    agent: Agent,
    queues: Sequence[str] | None,
    limit: int,
    lease_seconds: float | None,
    wait_seconds: float,
    worker: str | None,
    client_gone: Callable[[], bool] | None,
) -> list[Todo]:
    # A pool thread keeps its connection between calls: age it out as Django's request signals would.
    close_old_connections()
    try:
        return listen.claim_next_waiting(
            agent=agent,
            queues=queues,
            limit=limit,
            lease_seconds=lease_seconds,
            wait_seconds=wait_seconds,
            worker=worker,
            client_gone=client_gone,
        )
    finally:
        close_old_connections()


async def claim_next_waiting(
    *,
    agent: Agent,
    queues: Sequence[str] | None,
    limit: int = 1,
    lease_seconds: float | None = None,
    wait_seconds: float = 0,
    worker: str | None = None,
    client_gone: Callable[[], bool] | None = None,
) -> list[Todo]:
    return await sync_to_async(_claim_blocking, thread_sensitive=False)(
        agent, queues, limit, lease_seconds, wait_seconds, worker, client_gone
    )
