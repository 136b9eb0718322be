"""Per-agent budgets of a web process's resources (issue 28): an agent token is assumed compromised, and
one token must not take a process from every other agent.

- **Open waits**: long-poll claims (todos/longpoll.py) and awaits (todos/results.py) one agent holds at
  once, REST and MCP alike, at most ``limits.max_waits_per_agent()``. A slot is taken before the wait
  and given back in a ``finally``, so every way a wait ends (work, timeout, the client hanging up, which
  cancels the coroutine, an error, shutdown) frees it.
- **Request rate**: a token bucket per agent token (``limits.agent_rate_per_second()``, in bursts of
  ``limits.agent_rate_burst()``), charged once per request at authentication (REST, long-polls, MCP).

Both are counted **per process**, in memory. What they protect is per process: a wait costs its process's
event loop and wake-ups, a request its process's threads, and a process is what one token could starve.
Counting in PostgreSQL would add a write to every request (the rate) or a row that a killed process
leaves behind (the slots), to protect the database's own capacity, which its statements already bound.
The price: with N processes behind the balancer, an agent may hold up to N times each budget; the limits
are sized for that (docs/security.md), and a proxy's rate limit is the cluster-wide one.

Staff sessions are counted by their user name; they never long-poll claims (todos/auth.working_agent).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator

from todos import limits
from todos.errors import BudgetExceeded
from todos.models import Agent

# Buckets and slots are dropped once idle; this many agents' state is kept before a sweep of idle ones.
_MAX_TRACKED = 10_000


def _who(agent: Agent) -> int | str:
    return agent.pk if agent.pk is not None else agent.name


class WaitSlots:
    """How many waits each agent has open in this process. Waits live in the server's loop, or (outside
    ASGI) in request threads' own loops: a lock, not the loop, guards the counts."""

    def __init__(self) -> None:
        self._open: dict[int | str, int] = {}
        self._lock = threading.Lock()

    def open_for(self, agent: Agent) -> int:
        return self._open.get(_who(agent), 0)

    def take(self, agent: Agent) -> None:
        """Take one of ``agent``'s wait slots, or refuse (429) when they are all taken. Every take is
        followed by one give_back, in a finally."""
        cap = limits.max_waits_per_agent()
        who = _who(agent)
        with self._lock:
            held = self._open.get(who, 0)
            if cap > 0 and held >= cap:
                raise BudgetExceeded(
                    f"This agent already has {held} long-polls and awaits open on this server process, its limit "
                    "(AGENT_MAX_WAITS). Wait for one to end.",
                    limit="AGENT_MAX_WAITS",
                    retry_after=limits.WAIT_SLOT_RETRY_AFTER_SECONDS,
                )
            self._open[who] = held + 1

    def give_back(self, agent: Agent) -> None:
        who = _who(agent)
        with self._lock:
            left = self._open[who] - 1
            if left:
                self._open[who] = left
            else:
                del self._open[who]

    @contextlib.contextmanager
    def slot(self, agent: Agent) -> Iterator[None]:
        """Hold one of ``agent``'s wait slots for the block (take, then give_back however it ends)."""
        self.take(agent)
        try:
            yield
        finally:
            self.give_back(agent)


class RequestRate:
    """A token bucket per agent: ``rate`` tokens a second up to ``burst``; each request takes one."""

    def __init__(self) -> None:
        # agent -> (tokens left, time.monotonic() of the last charge)
        self._buckets: dict[int | str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def charge(self, agent: Agent) -> None:
        rate = limits.agent_rate_per_second()
        if rate <= 0:
            return
        burst = limits.agent_rate_burst()
        who = _who(agent)
        now = time.monotonic()
        with self._lock:
            tokens, at = self._buckets.get(who, (float(burst), now))
            tokens = min(float(burst), tokens + (now - at) * rate)
            if tokens < 1:
                self._buckets[who] = (tokens, now)
                retry_after = max(1, math.ceil((1 - tokens) / rate))
                raise BudgetExceeded(
                    f"This agent is over its request rate on this server process: {rate:g} a second in bursts of "
                    f"{burst} (AGENT_RATE_PER_SECOND, AGENT_RATE_BURST).",
                    limit="AGENT_RATE_PER_SECOND",
                    retry_after=retry_after,
                )
            if len(self._buckets) >= _MAX_TRACKED and who not in self._buckets:
                # A full bucket is the state of an agent never seen: forgetting those loses nothing.
                self._buckets = {k: v for k, v in self._buckets.items() if v[0] + (now - v[1]) * rate < burst}
            self._buckets[who] = (tokens - 1, now)


wait_slots = WaitSlots()
request_rate = RequestRate()
