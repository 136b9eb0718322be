"""Who an API request acts as: Bearer-token authentication (with a token cache every process
invalidates at once), and the caller's Agent. switchboard/ names the class by dotted path only."""

from __future__ import annotations

import threading
import time
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models.signals import post_delete, post_save
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from todos import budgets
from todos.listener import AGENTS_CHANNEL, listener
from todos.models import Agent, hash_token


class AgentPrincipal:
    """request.user for a request authenticated by an agent's token (request.auth is the Agent)."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False
    is_anonymous = False

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.username = agent.name
        self.pk = None

    def __str__(self) -> str:
        return f"agent:{self.agent.name}"


class TokenCache:
    """token hash -> (monotonic expiry, Agent). The lookup is a round trip and a large share of a
    small request's cost. The cache is trusted only while this process's listener is connected:
    every change to an agent row NOTIFYs AGENTS_CHANNEL in its own transaction, and each process's
    listener clears its cache on it (and on reconnecting, when notifications may have been missed),
    so a revoked, deactivated or rotated agent is refused by every process at once. The TTL is a
    safety net for writes that bypass the ORM's signals. Only known tokens are cached."""

    MAX = 10_000

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, Agent]] = {}
        self._lock = threading.Lock()
        # Bumped by every invalidation: a lookup that overlapped one must not cache what it read.
        self._generation = 0

    def clear(self) -> None:
        with self._lock:
            self._generation += 1
            self._entries.clear()

    def forget(self, token_hash: str) -> None:
        with self._lock:
            self._generation += 1
            self._entries.pop(token_hash, None)

    def cached(self, token_hash: str) -> Agent | None:
        """The agent, if this process may answer from memory; None means: look it up."""
        if settings.API_TOKEN_CACHE_SECONDS <= 0 or not listener.connected.is_set():
            return None
        hit = self._entries.get(token_hash)
        return hit[1] if hit is not None and hit[0] > time.monotonic() else None

    def active_agent(self, token_hash: str) -> Agent | None:
        ttl = settings.API_TOKEN_CACHE_SECONDS
        usable = ttl > 0 and listener.connected.is_set()
        if ttl > 0 and not usable:
            listener._ensure_running()
        if usable:
            hit = self._entries.get(token_hash)
            if hit is not None and hit[0] > time.monotonic():
                return hit[1]
        generation = self._generation
        agent = Agent.objects.filter(token_hash=token_hash, is_active=True).first()
        if usable and agent is not None:
            with self._lock:
                if generation == self._generation:
                    if len(self._entries) >= self.MAX:
                        self._entries.clear()
                    self._entries[token_hash] = (time.monotonic() + ttl, agent)
        return agent


token_cache = TokenCache()
listener.on_agents_changed(token_cache.clear)


def notify_agents_changed() -> None:
    """Tell every process to forget its cached tokens, when this transaction commits (call it after a
    bulk update of agents: signals do not fire for those)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [AGENTS_CHANNEL])


def _agent_changed(sender: Any, instance: Agent, **kwargs: Any) -> None:
    token_cache.forget(instance.token_hash)
    notify_agents_changed()


post_save.connect(_agent_changed, sender=Agent, dispatch_uid="todos.auth.agent_changed")
post_delete.connect(_agent_changed, sender=Agent, dispatch_uid="todos.auth.agent_changed.delete")


def bearer_token(header: bytes) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None for another scheme."""
    parts = header.split()
    if not parts or parts[0].lower() != b"bearer":
        return None
    if len(parts) != 2:
        raise exceptions.AuthenticationFailed("Malformed Authorization header: expected 'Bearer <token>'.")
    try:
        return parts[1].decode("ascii")
    except UnicodeDecodeError as exc:
        raise exceptions.AuthenticationFailed("Invalid token.") from exc


def agent_for_token(token: str) -> Agent:
    # The lookup is by hash, an indexed equality on a digest: its timing reveals nothing about
    # stored tokens, and the plaintext is never stored or logged.
    agent = token_cache.active_agent(hash_token(token))
    if agent is None:
        raise exceptions.AuthenticationFailed("Invalid or revoked token.")
    return agent


class BearerTokenAuthentication(BaseAuthentication):
    """``Authorization: Bearer <token>``; the token is looked up by its SHA-256 hash."""

    keyword = b"bearer"

    def authenticate(self, request: Request) -> tuple[AgentPrincipal, Agent] | None:
        token = bearer_token(get_authorization_header(request))
        if token is None:
            return None
        agent = agent_for_token(token)
        budgets.request_rate.charge(agent)
        return AgentPrincipal(agent), agent

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="switchboard"'


def caller_agent(request: Request) -> Agent:
    """The Agent a request acts as. Staff users on a session act as an unsaved agent named after them,
    whose scopes and powers are their Django permissions (staff_agent)."""
    if isinstance(request.auth, Agent):
        return request.auth
    user = request.user
    if user is not None and user.is_authenticated and user.is_staff:
        return staff_agent(user)
    raise exceptions.NotAuthenticated()


class StaffTakesNoWork(exceptions.PermissionDenied):
    default_detail = (
        "Staff sessions do not take work: claiming and every lease operation need an agent's token "
        "(manage.py create_agent)."
    )


def working_agent(request: Request) -> Agent:
    """The caller, for a claim or a lease operation: an agent's token, never a staff session (SPEC, Wave 4:
    staff may look and operate, but work is leased to agents, whose scopes and budgets bound it)."""
    agent = caller_agent(request)
    if is_staff_session(agent):
        raise StaffTakesNoWork()
    return agent


def is_staff_session(agent: Agent) -> bool:
    """An agent made by staff_agent for a session: never saved, so it has no primary key (every agent a
    token names is a row)."""
    return agent.pk is None


def staff_agent(user: Any) -> Agent:
    """The session's agent, exactly as the admin checks the same user (todos/admin, events/admin.py):
    - reading every queue needs ``todos.view_todo`` (or ``change_todo``, which implies it, as in the admin);
      its claim scopes serve only to see: working_agent refuses claims and leases to every staff session;
    - creating needs ``todos.add_todo``;
    - retry, cancel, run-now, priority, replay and resolving waits as an operator need ``todos.change_todo``
      (``can_retry_dead_letters``, which other code reads as that permission);
    - pause, resume and limits need ``todos.change_queue`` (``can_manage_queues``).
    A superuser has every permission; an inactive user none (Django's ModelBackend)."""
    may_change = user.has_perm("todos.change_todo")
    may_view = may_change or user.has_perm("todos.view_todo")
    return Agent(
        name=f"staff:{user.get_username()}",
        claim_scopes=["*"] if may_view else [],
        create_scopes=["*"] if user.has_perm("todos.add_todo") else [],
        can_retry_dead_letters=may_change,
        can_manage_queues=user.has_perm("todos.change_queue"),
    )
