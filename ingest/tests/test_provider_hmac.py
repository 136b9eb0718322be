"""The plain HMAC verifier and identify."""

from __future__ import annotations

import pytest

from ingest.errors import InvalidDelivery
from ingest.providers import hmac
from ingest.tests.conftest import hmac_headers


def test_verify_hmac_takes_the_type_from_the_header_or_else_the_payload():
    body = b'{"type": "build.finished"}'
    verified = hmac.verify(body, hmac_headers(body, delivery="d9"), ["plain-hmac-secret"])
    assert hmac.identify(verified, {"type": "build.finished"}) == ("d9", "build.finished")
    verified = hmac.verify(body, hmac_headers(body, delivery="d9", event="deploy"), ["plain-hmac-secret"])
    assert hmac.identify(verified, {"type": "build.finished"}) == ("d9", "deploy")


def test_identify_hmac_without_a_delivery_id_is_invalid():
    body = b'{"type": "x"}'
    headers = hmac_headers(body)
    del headers["X-Delivery-Id"]
    verified = hmac.verify(body, headers, ["plain-hmac-secret"])
    with pytest.raises(InvalidDelivery, match="X-Delivery-Id"):
        hmac.identify(verified, {"type": "x"})
