"""Fixtures for ingest: sources, routes, and deliveries signed the way each provider signs them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from ingest.models import Route, Source

GITHUB_SECRET = "gh-webhook-secret"
STRIPE_SECRET = "whsec_test_0123456789abcdef"
STANDARD_SECRET = "whsec_" + base64.b64encode(b"standard-webhooks-key-32-bytes!!").decode()
HMAC_SECRET = "plain-hmac-secret"


def github_signature(body: bytes, secret: str = GITHUB_SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def github_headers(body: bytes, event: str = "pull_request", delivery: str | None = None, secret: str = GITHUB_SECRET):
    return {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": github_signature(body, secret),
        "X-GitHub-Hook-ID": "42",
        "User-Agent": "GitHub-Hookshot/abc123",
    }


def stripe_headers(body: bytes, secret: str = STRIPE_SECRET, timestamp: int | None = None) -> dict[str, str]:
    t = int(time.time()) if timestamp is None else timestamp
    v1 = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return {"Stripe-Signature": f"t={t},v1={v1}"}


def standard_headers(
    body: bytes, secret: str = STANDARD_SECRET, msg_id: str | None = None, timestamp: int | None = None
) -> dict[str, str]:
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    t = int(time.time()) if timestamp is None else timestamp
    key = base64.b64decode(secret.removeprefix("whsec_"))
    sig = base64.b64encode(hmac.new(key, f"{msg_id}.{t}.".encode() + body, hashlib.sha256).digest()).decode()
    return {"webhook-id": msg_id, "webhook-timestamp": str(t), "webhook-signature": f"v1,{sig}"}


def hmac_headers(
    body: bytes, secret: str = HMAC_SECRET, delivery: str | None = None, event: str | None = None
) -> dict[str, str]:
    headers = {
        "X-Signature-256": "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest(),
        "X-Delivery-Id": delivery or str(uuid.uuid4()),
    }
    if event:
        headers["X-Event-Type"] = event
    return headers


def pr_payload(action: str = "opened", number: int = 7, repo: str = "octo/hello") -> dict[str, Any]:
    return {
        "action": action,
        "number": number,
        "pull_request": {"number": number, "title": "Add a feature", "user": {"login": "mona"}},
        "repository": {"full_name": repo},
    }


def to_body(payload: Any) -> bytes:
    return json.dumps(payload).encode()


SECRETS = {"github": GITHUB_SECRET, "stripe": STRIPE_SECRET, "standard": STANDARD_SECRET, "hmac": HMAC_SECRET}


@pytest.fixture
def make_source(db: None) -> Callable[..., Source]:
    def make(slug: str = "gh", provider: str = "github", **kw: Any) -> Source:
        kw.setdefault("secret", SECRETS[provider])
        return Source.objects.create(slug=slug, provider=provider, **kw)

    return make


@pytest.fixture
def make_route(db: None) -> Callable[..., Route]:
    def make(source: Source, pattern: str = "*", queue: str = "inbox", **kw: Any) -> Route:
        return Route.objects.create(source=source, event_pattern=pattern, queue=queue, **kw)

    return make


@pytest.fixture
def github_source(make_source: Callable[..., Source], make_route: Callable[..., Route]) -> Source:
    source = make_source("gh", "github")
    make_route(
        source,
        "pull_request.*",
        "github.prs",
        kind="review",
        title_template="{repository.full_name}#{pull_request.number}: {pull_request.title}",
    )
    return source


@pytest.fixture
def post_webhook(client: Any) -> Callable[..., Any]:
    def post(slug: str, body: bytes, headers: dict[str, str], content_type: str = "application/json") -> Any:
        return client.post(f"/ingest/{slug}/", data=body, content_type=content_type, headers=headers)

    return post


# The stream tests' real redis-server (session-wide) and a flushed client per test.
from ingest.tests.streams_support import redis_client, redis_server  # noqa: E402, F401
