"""Stripe's verifier, with the stripe library as the oracle both ways."""

from __future__ import annotations

import json
import time

import pytest
import stripe as stripe_library

from ingest.errors import InvalidDelivery, SignatureInvalid
from ingest.providers import stripe
from ingest.providers.base import Verified
from ingest.tests.conftest import STRIPE_SECRET, stripe_headers


def test_verify_stripe_accepts_a_header_made_by_the_stripe_library():
    body = json.dumps({"id": "evt_1", "object": "event", "type": "invoice.paid"})
    header = stripe_library.WebhookSignature.generate_signature_header(body, STRIPE_SECRET)
    verified = stripe.verify(body.encode(), {"Stripe-Signature": header}, [STRIPE_SECRET])
    assert stripe.identify(verified, json.loads(body)) == ("evt_1", "invoice.paid")


def test_stripe_library_accepts_our_test_headers():
    # The oracle the other way round: our fixture signs as Stripe does.
    body = b'{"id": "evt_2", "type": "charge.succeeded"}'
    header = stripe_headers(body)["Stripe-Signature"]
    assert stripe_library.WebhookSignature.verify_header(body, header, STRIPE_SECRET, tolerance=300)


def test_verify_stripe_accepts_any_matching_v1_among_several():
    body = b'{"id": "evt_3", "type": "x"}'
    t = int(time.time())
    good = stripe_headers(body, timestamp=t)["Stripe-Signature"].split("v1=")[1]
    header = f"t={t},v1={'0' * 64},v0={'1' * 64},v1={good}"
    assert stripe.verify(body, {"Stripe-Signature": header}, [STRIPE_SECRET])


def test_verify_stripe_keys_the_hmac_with_the_whole_whsec_string():
    body = b'{"id": "evt_4", "type": "x"}'
    decoded_key = STRIPE_SECRET.removeprefix("whsec_")
    with pytest.raises(SignatureInvalid):
        stripe.verify(body, stripe_headers(body, secret=decoded_key), [STRIPE_SECRET])


@pytest.mark.parametrize("skew", [-301, 301, -3600])
def test_verify_stripe_with_a_timestamp_outside_300_seconds_is_stale(skew):
    body = b'{"id": "evt_5", "type": "x"}'
    now = time.time()
    headers = stripe_headers(body, timestamp=int(now) + skew)
    with pytest.raises(SignatureInvalid, match="tolerance"):
        stripe.verify(body, headers, [STRIPE_SECRET], now=now)


@pytest.mark.parametrize(
    "header", ["", "t=abc,v1=00", "v1=00", "t=1700000000", "t=1700000000,v0=00", "garbage", "t=,v1="]
)
def test_verify_stripe_with_a_malformed_header_is_invalid(header):
    with pytest.raises(SignatureInvalid):
        stripe.verify(b"{}", {"Stripe-Signature": header}, [STRIPE_SECRET])


def test_identify_stripe_without_an_id_is_invalid():
    with pytest.raises(InvalidDelivery, match="id"):
        stripe.identify(Verified("stripe"), {"type": "x"})
