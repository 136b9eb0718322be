"""The provider registry: every provider has its parts, a provider added in one module works end to end
(admin choices, add_source, the receiver), and a pull-only provider's sources refuse webhook POSTs."""

from __future__ import annotations

import hmac as stdlib_hmac
import io
import pkgutil
from collections.abc import Mapping
from typing import Any

import pytest
from django.core.management import call_command

import ingest.providers
from events.models import Event
from ingest import providers
from ingest.errors import SignatureInvalid
from ingest.models import Source
from ingest.providers.base import Provider, Verified, checked_ids, kept, lower
from ingest.tests.conftest import (
    STANDARD_SECRET,
    STRIPE_SECRET,
    github_headers,
    hmac_headers,
    standard_headers,
    stripe_headers,
)
from todos.models import Todo

SIGNED = {
    "github": (github_headers, "gh-webhook-secret"),
    "stripe": (stripe_headers, STRIPE_SECRET),
    "standard": (standard_headers, STANDARD_SECRET),
    "hmac": (hmac_headers, "plain-hmac-secret"),
}


def test_every_provider_module_is_registered_under_its_own_name():
    modules = {m.name for m in pkgutil.iter_modules(ingest.providers.__path__)} - {"base"}
    assert modules == set(providers.PROVIDERS)
    for name, provider in providers.PROVIDERS.items():
        assert provider.name == name
        assert provider.label and callable(provider.identify)
        assert provider.verify is None or callable(provider.verify)  # None: pull-only (stream)
        assert not any("signature" in header.lower() for header in provider.kept_headers)


def test_every_webhook_provider_has_a_signing_fixture():
    # A new provider brings its own tests; this one only notices a provider that has none here.
    assert set(SIGNED) == {name for name, p in providers.PROVIDERS.items() if p.accepts_webhooks}


@pytest.mark.parametrize("name", sorted(SIGNED))
def test_verify_never_keeps_a_signature_header(name):
    make_headers, secret = SIGNED[name]
    body = b'{"id": "evt", "type": "t"}'
    headers = {**make_headers(body), "User-Agent": "sender/1", "Authorization": "Bearer x", "Cookie": "a=b"}
    kept_headers = providers.get(name).authenticate(body, headers, [secret]).headers
    assert kept_headers.get("User-Agent") == "sender/1"
    assert not any(word in h.lower() for h in kept_headers for word in ("signature", "authorization", "cookie"))


@pytest.mark.parametrize("name", sorted(SIGNED))
def test_authenticate_with_no_secret_configured_is_invalid(name):
    make_headers, _ = SIGNED[name]
    body = b'{"id": "evt", "type": "t"}'
    with pytest.raises(SignatureInvalid, match="no secret"):
        providers.get(name).authenticate(body, make_headers(body), ["", ""])


def test_source_provider_choices_are_the_registry():
    assert Source._meta.get_field("provider").choices == providers.choices()


# --- a provider added in a test, as a new module would add it ------------------------------------

TOY_HEADERS = ("X-Toy-Delivery", "User-Agent")


def toy_verify(
    raw_body: bytes, headers: Mapping[str, str], secrets: list[str], *, now: float | None = None
) -> Verified:
    h = lower(headers)
    token = h.get("x-toy-token", "").encode()
    if not any(stdlib_hmac.compare_digest(secret.encode(), token) for secret in secrets):
        raise SignatureInvalid("The X-Toy-Token does not match.")
    return Verified("toy", delivery_id=h.get("x-toy-delivery"), headers=kept(TOY_HEADERS, h))


def toy_identify(verified: Verified, payload: dict[str, Any]) -> tuple[str, str]:
    return checked_ids(verified.delivery_id, payload.get("kind"), "X-Toy-Delivery header or payload kind")


TOY = Provider(
    name="toy", label="Toy (X-Toy-Token)", verify=toy_verify, identify=toy_identify, kept_headers=TOY_HEADERS
)
PULLED = Provider(name="pulled", label="Pulled entries", verify=None, identify=toy_identify)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(providers.PROVIDERS, TOY.name, TOY)
    monkeypatch.setitem(providers.PROVIDERS, PULLED.name, PULLED)


def test_a_provider_added_to_the_registry_works_from_add_source_to_todo(registered, db, client):
    out = io.StringIO()
    call_command("add_source", "toys", "--provider", "toy", "--route", "built", "toy.builds", "build", stdout=out)
    secret = out.getvalue().strip().splitlines()[-1]
    body = b'{"kind": "built", "n": 1}'
    headers = {"X-Toy-Token": secret, "X-Toy-Delivery": "t-1", "User-Agent": "toy/1"}

    response = client.post("/ingest/toys/", data=body, content_type="application/json", headers=headers)

    assert response.status_code == 202, response.content
    event = Event.objects.get()
    assert (event.source, event.type, event.delivery_id) == ("toys", "built", "t-1")
    assert event.headers == {"X-Toy-Delivery": "t-1", "User-Agent": "toy/1"}
    assert Todo.objects.get().queue == "toy.builds"
    wrong = {**headers, "X-Toy-Token": "not-it", "X-Toy-Delivery": "t-2"}
    assert client.post("/ingest/toys/", data=body, content_type="application/json", headers=wrong).status_code == 401


def test_a_new_provider_is_offered_by_the_admin_form(registered, admin_client):
    body = admin_client.page("/admin/ingest/source/add/")
    assert '<option value="toy">Toy (X-Toy-Token)</option>' in body


def test_a_webhook_post_to_a_pull_only_source_is_401_and_stores_nothing(registered, db, client):
    Source.objects.create(slug="entries", provider="pulled", secret="unused-by-pulls")
    response = client.post("/ingest/entries/", data=b'{"kind": "x"}', content_type="application/json")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert Event.objects.count() == 0 and Todo.objects.count() == 0


def test_add_source_for_a_pull_only_provider_needs_no_secret(registered, db):
    out = io.StringIO()
    call_command("add_source", "entries", "--provider", "pulled", "--route", "*", "inbox", stdout=out)
    source = Source.objects.get()
    assert source.secret == "" and "takes no webhooks" in out.getvalue()


def test_the_admin_adds_a_pull_only_source_without_a_secret(registered, admin_client):
    form = {
        "slug": "entries",
        "provider": "pulled",
        "is_active": "on",
        **{f"routes-{k}": v for k, v in (("TOTAL_FORMS", "0"), ("INITIAL_FORMS", "0"), ("MAX_NUM_FORMS", "1000"))},
    }
    response = admin_client.post("/admin/ingest/source/add/", form)
    assert response.status_code == 302, response.content[:2000]
    assert Source.objects.get().provider == "pulled"
