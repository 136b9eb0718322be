"""The Standard Webhooks verifier, with the standardwebhooks library as the oracle both ways."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime

import pytest
import standardwebhooks

from ingest.errors import SignatureInvalid
from ingest.providers import standard
from ingest.tests.conftest import STANDARD_SECRET, standard_headers


def test_verify_standard_accepts_a_signature_made_by_the_standardwebhooks_library():
    body = json.dumps({"type": "user.created", "data": {"id": 1}})
    now = datetime.now(tz=UTC)
    signature = standardwebhooks.Webhook(STANDARD_SECRET).sign("msg_1", now, body)
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(int(now.timestamp())), "webhook-signature": signature}
    verified = standard.verify(body.encode(), headers, [STANDARD_SECRET])
    assert standard.identify(verified, json.loads(body)) == ("msg_1", "user.created")
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
    assert standard.verify(body, headers, [STANDARD_SECRET])


def test_verify_standard_signs_the_id_too():
    body = b'{"type": "a"}'
    headers = standard_headers(body, msg_id="msg_4")
    headers["webhook-id"] = "msg_5"
    with pytest.raises(SignatureInvalid):
        standard.verify(body, headers, [STANDARD_SECRET])


@pytest.mark.parametrize("skew", [-301, 301])
def test_verify_standard_with_a_timestamp_outside_five_minutes_is_stale(skew):
    body = b'{"type": "a"}'
    now = time.time()
    headers = standard_headers(body, timestamp=int(now) + skew)
    with pytest.raises(SignatureInvalid, match="tolerance"):
        standard.verify(body, headers, [STANDARD_SECRET], now=now)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_verify_standard_without_a_required_header_is_invalid(missing):
    body = b'{"type": "a"}'
    headers = standard_headers(body)
    del headers[missing]
    with pytest.raises(SignatureInvalid):
        standard.verify(body, headers, [STANDARD_SECRET])


def test_standard_key_accepts_unpadded_base64_and_refuses_garbage():
    key = b"sixteen byte key"
    unpadded = base64.b64encode(key).decode().rstrip("=")
    assert standard.standard_key("whsec_" + unpadded) == key
    with pytest.raises(ValueError):
        standard.standard_key("whsec_not base64!")
