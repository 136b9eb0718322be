"""The verifiers alone: pure functions, checked against each provider's own example or library."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime

import pytest
import standardwebhooks
import stripe

from ingest import signatures
from ingest.errors import InvalidDelivery, SignatureInvalid
from ingest.tests.conftest import (
    STANDARD_SECRET,
    STRIPE_SECRET,
    github_headers,
    hmac_headers,
    standard_headers,
    stripe_headers,
)

# GitHub's documented test vector ("Validating webhook deliveries").
GITHUB_VECTOR_SECRET = "It's a Secret to Everybody"
GITHUB_VECTOR_BODY = b"Hello, World!"
GITHUB_VECTOR_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def test_verify_github_accepts_githubs_documented_test_vector():
    headers = {"X-Hub-Signature-256": GITHUB_VECTOR_SIGNATURE, "X-GitHub-Event": "ping", "X-GitHub-Delivery": "d1"}
    verified = signatures.verify("github", GITHUB_VECTOR_BODY, headers, [GITHUB_VECTOR_SECRET])
    assert (verified.delivery_id, verified.event_type) == ("d1", "ping")


def test_verify_github_with_header_names_in_any_case_is_accepted():
    headers = {"x-hub-signature-256": GITHUB_VECTOR_SIGNATURE}
    assert signatures.verify("github", GITHUB_VECTOR_BODY, headers, [GITHUB_VECTOR_SECRET]).provider == "github"


@pytest.mark.parametrize(
    ("body", "signature", "secret"),
    [
        (b"Hello, World?", GITHUB_VECTOR_SIGNATURE, GITHUB_VECTOR_SECRET),  # tampered body
        (GITHUB_VECTOR_BODY, GITHUB_VECTOR_SIGNATURE, "another secret"),  # wrong secret
        (GITHUB_VECTOR_BODY, GITHUB_VECTOR_SIGNATURE.upper(), GITHUB_VECTOR_SECRET),  # not GitHub's format
        (GITHUB_VECTOR_BODY, GITHUB_VECTOR_SIGNATURE.removeprefix("sha256="), GITHUB_VECTOR_SECRET),
        (GITHUB_VECTOR_BODY, "sha1=" + "0" * 40, GITHUB_VECTOR_SECRET),  # the legacy header's scheme
        (GITHUB_VECTOR_BODY, "sha256=é", GITHUB_VECTOR_SECRET),  # non-ASCII must not crash the compare
    ],
)
def test_verify_github_with_a_bad_signature_is_invalid(body, signature, secret):
    with pytest.raises(SignatureInvalid) as exc:
        signatures.verify("github", body, {"X-Hub-Signature-256": signature}, [secret])
    assert exc.value.code == "unauthorized"


def test_verify_github_without_the_signature_header_is_invalid():
    with pytest.raises(SignatureInvalid, match="X-Hub-Signature-256"):
        signatures.verify("github", GITHUB_VECTOR_BODY, {"X-Hub-Signature": "sha1=abc"}, [GITHUB_VECTOR_SECRET])


def test_verify_accepts_the_previous_secret_during_rotation():
    headers = {"X-Hub-Signature-256": GITHUB_VECTOR_SIGNATURE}
    assert signatures.verify("github", GITHUB_VECTOR_BODY, headers, ["the-new-one", GITHUB_VECTOR_SECRET])


def test_verify_with_no_secret_configured_is_invalid():
    with pytest.raises(SignatureInvalid):
        signatures.verify("github", GITHUB_VECTOR_BODY, {"X-Hub-Signature-256": GITHUB_VECTOR_SIGNATURE}, ["", ""])


def test_verify_github_keeps_provider_headers_but_never_the_signature():
    body = b"{}"
    verified = signatures.verify("github", body, github_headers(body, delivery="d-1"), ["gh-webhook-secret"])
    assert verified.headers["X-GitHub-Delivery"] == "d-1"
    assert verified.headers["X-GitHub-Hook-ID"] == "42"
    assert not any("signature" in name.lower() for name in verified.headers)


# --- Stripe ----------------------------------------------------------------------------------


def test_verify_stripe_accepts_a_header_made_by_the_stripe_library():
    body = json.dumps({"id": "evt_1", "object": "event", "type": "invoice.paid"})
    header = stripe.WebhookSignature.generate_signature_header(body, STRIPE_SECRET)
    verified = signatures.verify("stripe", body.encode(), {"Stripe-Signature": header}, [STRIPE_SECRET])
    assert signatures.identify(verified, json.loads(body)) == ("evt_1", "invoice.paid")


def test_stripe_library_accepts_our_test_headers():
    # The oracle the other way round: our fixture signs as Stripe does.
    body = b'{"id": "evt_2", "type": "charge.succeeded"}'
    header = stripe_headers(body)["Stripe-Signature"]
    assert stripe.WebhookSignature.verify_header(body, header, STRIPE_SECRET, tolerance=300)


def test_verify_stripe_accepts_any_matching_v1_among_several():
    body = b'{"id": "evt_3", "type": "x"}'
    t = int(time.time())
    good = stripe_headers(body, timestamp=t)["Stripe-Signature"].split("v1=")[1]
    header = f"t={t},v1={'0' * 64},v0={'1' * 64},v1={good}"
    assert signatures.verify("stripe", body, {"Stripe-Signature": header}, [STRIPE_SECRET])


def test_verify_stripe_keys_the_hmac_with_the_whole_whsec_string():
    body = b'{"id": "evt_4", "type": "x"}'
    decoded_key = STRIPE_SECRET.removeprefix("whsec_")
    with pytest.raises(SignatureInvalid):
        signatures.verify("stripe", body, stripe_headers(body, secret=decoded_key), [STRIPE_SECRET])


@pytest.mark.parametrize("skew", [-301, 301, -3600])
def test_verify_stripe_with_a_timestamp_outside_300_seconds_is_stale(skew):
    body = b'{"id": "evt_5", "type": "x"}'
    now = time.time()
    headers = stripe_headers(body, timestamp=int(now) + skew)
    with pytest.raises(SignatureInvalid, match="tolerance"):
        signatures.verify("stripe", body, headers, [STRIPE_SECRET], now=now)


@pytest.mark.parametrize(
    "header", ["", "t=abc,v1=00", "v1=00", "t=1700000000", "t=1700000000,v0=00", "garbage", "t=,v1="]
)
def test_verify_stripe_with_a_malformed_header_is_invalid(header):
    with pytest.raises(SignatureInvalid):
        signatures.verify("stripe", b"{}", {"Stripe-Signature": header}, [STRIPE_SECRET])


# --- Standard Webhooks ------------------------------------------------------------------------


def test_verify_standard_accepts_a_signature_made_by_the_standardwebhooks_library():
    body = json.dumps({"type": "user.created", "data": {"id": 1}})
    now = datetime.now(tz=UTC)
    signature = standardwebhooks.Webhook(STANDARD_SECRET).sign("msg_1", now, body)
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(int(now.timestamp())), "webhook-signature": signature}
    verified = signatures.verify("standard", body.encode(), headers, [STANDARD_SECRET])
    assert signatures.identify(verified, json.loads(body)) == ("msg_1", "user.created")
    assert verified.headers == {"webhook-id": "msg_1", "webhook-timestamp": headers["webhook-timestamp"]}


def test_standardwebhooks_library_accepts_our_test_headers():
    body = b'{"type": "user.deleted"}'
    headers = standard_headers(body, msg_id="msg_2")
    assert standardwebhooks.Webhook(STANDARD_SECRET).verify(body, headers) == {"type": "user.deleted"}


def test_verify_standard_accepts_one_match_among_space_separated_signatures():
    body = b'{"type": "a"}'
    headers = standard_headers(body, msg_id="msg_3")
    bogus = "v1," + base64.b64encode(b"x" * 32).decode()
    headers["webhook-signature"] = f"v1a,abcd {bogus} {headers['webhook-signature']}"
    assert signatures.verify("standard", body, headers, [STANDARD_SECRET])


def test_verify_standard_signs_the_id_too():
    body = b'{"type": "a"}'
    headers = standard_headers(body, msg_id="msg_4")
    headers["webhook-id"] = "msg_5"
    with pytest.raises(SignatureInvalid):
        signatures.verify("standard", body, headers, [STANDARD_SECRET])


@pytest.mark.parametrize("skew", [-301, 301])
def test_verify_standard_with_a_timestamp_outside_five_minutes_is_stale(skew):
    body = b'{"type": "a"}'
    now = time.time()
    headers = standard_headers(body, timestamp=int(now) + skew)
    with pytest.raises(SignatureInvalid, match="tolerance"):
        signatures.verify("standard", body, headers, [STANDARD_SECRET], now=now)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_verify_standard_without_a_required_header_is_invalid(missing):
    body = b'{"type": "a"}'
    headers = standard_headers(body)
    del headers[missing]
    with pytest.raises(SignatureInvalid):
        signatures.verify("standard", body, headers, [STANDARD_SECRET])


def test_standard_key_accepts_unpadded_base64_and_refuses_garbage():
    key = b"sixteen byte key"
    unpadded = base64.b64encode(key).decode().rstrip("=")
    assert signatures.standard_key("whsec_" + unpadded) == key
    with pytest.raises(ValueError):
        signatures.standard_key("whsec_not base64!")


# --- plain HMAC --------------------------------------------------------------------------------


def test_verify_hmac_takes_the_type_from_the_header_or_else_the_payload():
    body = b'{"type": "build.finished"}'
    verified = signatures.verify("hmac", body, hmac_headers(body, delivery="d9"), ["plain-hmac-secret"])
    assert signatures.identify(verified, {"type": "build.finished"}) == ("d9", "build.finished")
    verified = signatures.verify("hmac", body, hmac_headers(body, delivery="d9", event="deploy"), ["plain-hmac-secret"])
    assert signatures.identify(verified, {"type": "build.finished"}) == ("d9", "deploy")


def test_identify_hmac_without_a_delivery_id_is_invalid():
    body = b'{"type": "x"}'
    headers = hmac_headers(body)
    del headers["X-Delivery-Id"]
    verified = signatures.verify("hmac", body, headers, ["plain-hmac-secret"])
    with pytest.raises(InvalidDelivery, match="X-Delivery-Id"):
        signatures.identify(verified, {"type": "x"})


# --- identify -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "payload", "expected"),
    [
        ("pull_request", {"action": "opened"}, "pull_request.opened"),
        ("push", {"ref": "refs/heads/main"}, "push"),
        ("ping", {"zen": "Keep it logically awesome.", "hook_id": 1}, "ping"),
        ("issues", {"action": 3}, "issues"),  # a non-text action is not part of the type
    ],
)
def test_identify_github_appends_the_action(event, payload, expected):
    verified = signatures.Verified("github", delivery_id="d", event_type=event)
    assert signatures.identify(verified, payload) == ("d", expected)


def test_identify_with_an_overlong_delivery_id_is_invalid():
    verified = signatures.Verified("github", delivery_id="d" * 201, event_type="push")
    with pytest.raises(InvalidDelivery):
        signatures.identify(verified, {})


def test_identify_stripe_without_an_id_is_invalid():
    with pytest.raises(InvalidDelivery, match="id"):
        signatures.identify(signatures.Verified("stripe"), {"type": "x"})


@pytest.mark.parametrize(
    ("provider", "make_headers", "secret"),
    [
        ("github", github_headers, "gh-webhook-secret"),
        ("stripe", stripe_headers, STRIPE_SECRET),
        ("standard", standard_headers, STANDARD_SECRET),
        ("hmac", hmac_headers, "plain-hmac-secret"),
    ],
)
def test_verify_never_keeps_a_signature_header(provider, make_headers, secret):
    body = b'{"id": "evt", "type": "t"}'
    headers = {**make_headers(body), "User-Agent": "sender/1", "Authorization": "Bearer x", "Cookie": "a=b"}
    kept = signatures.verify(provider, body, headers, [secret]).headers
    assert kept.get("User-Agent") == "sender/1"
    assert not any(word in name.lower() for name in kept for word in ("signature", "authorization", "cookie"))
