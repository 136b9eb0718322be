"""Properties over arbitrary input: the renderer and the verifiers never fail in any way but their own."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ingest import providers
from ingest.errors import SignatureInvalid
from ingest.routing import TITLE_MAX_LENGTH, render_title

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@given(template=st.text(max_size=200), payload=json_values)
def test_render_title_is_total_bounded_and_one_line(template, payload):
    title = render_title(template, payload)
    assert len(title) <= TITLE_MAX_LENGTH
    assert not any(ord(c) < 32 or ord(c) == 127 for c in title)


header_names = st.sampled_from(
    [
        "X-Hub-Signature-256",
        "X-Signature-256",
        "Stripe-Signature",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "X-GitHub-Delivery",
    ]
)


@given(
    provider=st.sampled_from(sorted(n for n, p in providers.PROVIDERS.items() if p.accepts_webhooks)),
    body=st.binary(max_size=100),
    headers=st.dictionaries(header_names, st.text(max_size=80), max_size=7),
    secrets=st.lists(st.text(max_size=40), max_size=2),
)
def test_verify_refuses_arbitrary_headers_only_with_signature_invalid(provider, body, headers, secrets):
    try:
        providers.get(provider).authenticate(body, headers, secrets)
    except SignatureInvalid:
        pass
    else:  # a random header cannot be a valid HMAC
        raise AssertionError("an arbitrary delivery was accepted")
