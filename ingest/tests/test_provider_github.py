"""GitHub's verifier and identify, against GitHub's documented test vector."""

from __future__ import annotations

import pytest

from ingest.errors import InvalidDelivery, SignatureInvalid
from ingest.providers import github
from ingest.providers.base import Verified
from ingest.tests.conftest import github_headers

# GitHub's documented test vector ("Validating webhook deliveries").
GITHUB_VECTOR_SECRET = "It's a Secret to Everybody"
GITHUB_VECTOR_BODY = b"Hello, World!"
GITHUB_VECTOR_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def test_verify_github_accepts_githubs_documented_test_vector():
    headers = {"X-Hub-Signature-256": GITHUB_VECTOR_SIGNATURE, "X-GitHub-Event": "ping", "X-GitHub-Delivery": "d1"}
    verified = github.verify(GITHUB_VECTOR_BODY, headers, [GITHUB_VECTOR_SECRET])
    assert (verified.delivery_id, verified.event_type) == ("d1", "ping")


def test_verify_github_with_header_names_in_any_case_is_accepted():
    headers = {"x-hub-signature-256": GITHUB_VECTOR_SIGNATURE}
    assert github.verify(GITHUB_VECTOR_BODY, headers, [GITHUB_VECTOR_SECRET]).provider == "github"


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
        github.verify(body, {"X-Hub-Signature-256": signature}, [secret])
    assert exc.value.code == "unauthorized"


def test_verify_github_without_the_signature_header_is_invalid():
    with pytest.raises(SignatureInvalid, match="X-Hub-Signature-256"):
        github.verify(GITHUB_VECTOR_BODY, {"X-Hub-Signature": "sha1=abc"}, [GITHUB_VECTOR_SECRET])


def test_verify_accepts_the_previous_secret_during_rotation():
    headers = {"X-Hub-Signature-256": GITHUB_VECTOR_SIGNATURE}
    assert github.verify(GITHUB_VECTOR_BODY, headers, ["the-new-one", GITHUB_VECTOR_SECRET])


def test_verify_with_no_secret_configured_is_invalid():
    with pytest.raises(SignatureInvalid):
        github.PROVIDER.authenticate(GITHUB_VECTOR_BODY, {"X-Hub-Signature-256": GITHUB_VECTOR_SIGNATURE}, ["", ""])


def test_verify_github_keeps_provider_headers_but_never_the_signature():
    body = b"{}"
    verified = github.verify(body, github_headers(body, delivery="d-1"), ["gh-webhook-secret"])
    assert verified.headers["X-GitHub-Delivery"] == "d-1"
    assert verified.headers["X-GitHub-Hook-ID"] == "42"
    assert not any("signature" in name.lower() for name in verified.headers)


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
    verified = Verified("github", delivery_id="d", event_type=event)
    assert github.identify(verified, payload) == ("d", expected)


def test_identify_with_an_overlong_delivery_id_is_invalid():
    verified = Verified("github", delivery_id="d" * 201, event_type="push")
    with pytest.raises(InvalidDelivery):
        github.identify(verified, {})
