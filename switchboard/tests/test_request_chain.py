"""The ASGI handler's middleware chains (switchboard/asgi.py): which requests take the lean one, and that
no chain a long-poll or a token's request runs through hops a thread for a middleware."""

from __future__ import annotations

import io

import pytest
from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.utils.deprecation import MiddlewareMixin
from django.utils.module_loading import import_string

from switchboard import asgi, middleware


def _request(path: str, authorization: str | None) -> ASGIRequest:
    headers = [(b"host", b"testserver")]
    if authorization is not None:
        headers.append((b"authorization", authorization.encode()))
    scope = {"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": headers}
    return ASGIRequest(scope, io.BytesIO())


@pytest.mark.parametrize(
    ("path", "authorization", "lean"),
    [
        ("/api/v1/todos/claim/", "Bearer sk_x", True),
        ("/api/v1/todos/claim/", "bearer sk_x", True),
        ("/api/v1/events/", "Bearer sk_x", True),
        ("/api/v1/todos/", None, False),  # a session's API call keeps sessions and CSRF
        ("/api/v1/todos/", "Basic dXNlcjpwdw==", False),
        ("/api/v1/todos/", "Bearer", False),  # refused by DRF on the whole chain, as before
        ("/admin/", "Bearer sk_x", False),  # the admin never
        ("/admin/login/", "Bearer sk_x", False),
        ("/ingest/github/", "Bearer sk_x", False),
        ("/decide/td_1/", "Bearer sk_x", False),
    ],
)
def test_only_an_api_request_with_a_bearer_token_takes_the_lean_chain(
    path: str, authorization: str | None, lean: bool
) -> None:
    assert asgi._lean(_request(path, authorization)) is lean


def test_the_lean_chain_is_the_whole_chain_without_the_session_middleware() -> None:
    whole, lean = asgi._middleware(False), asgi._middleware(True)
    assert len(whole) == len(settings.MIDDLEWARE)
    assert lean == [path for path in whole if path not in settings.SESSION_ONLY_MIDDLEWARE]
    assert len(lean) == len(whole) - len(settings.SESSION_ONLY_MIDDLEWARE)
    # Request ids, log lines and metrics, HTTPS and its headers, and the 503 on a lost database stay.
    assert lean[0] == "switchboard.middleware.RequestObservabilityMiddleware"
    assert "switchboard.middleware.SecurityOnTheLoopMiddleware" in lean
    assert "switchboard.middleware.XFrameOptionsOnTheLoopMiddleware" in lean
    assert lean[-1] == "switchboard.api.DatabaseUnavailableMiddleware"


def _hops(cls: type) -> bool:
    """Whether Django's async chain runs a hook of ``cls`` through sync_to_async (a thread hop)."""
    if not issubclass(cls, MiddlewareMixin) or issubclass(cls, middleware._OnTheLoop):
        return False
    return any(hasattr(cls, hook) for hook in ("process_request", "process_response", "process_view"))


def test_no_middleware_of_the_lean_async_chain_hops_a_thread() -> None:
    for path in asgi._middleware(True):
        cls = import_string(path)
        assert getattr(cls, "async_capable", False), path
        assert not _hops(cls), path
    # The whole chain's hops are the session's, for a session's request only.
    hopping = {path for path in asgi._middleware(False) if _hops(import_string(path))}
    assert hopping <= set(settings.SESSION_ONLY_MIDDLEWARE)


def test_each_chain_is_built_once_in_its_mode() -> None:
    handler = asgi.django_application
    for (lean, is_async), chain in handler._chains.items():
        assert iscoroutinefunction(chain._middleware_chain) is is_async, (lean, is_async)  # type: ignore[attr-defined]
