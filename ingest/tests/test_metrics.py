"""switchboard_ingest_deliveries_total counts each delivery by source and outcome."""

from __future__ import annotations

from prometheus_client import REGISTRY

from ingest.tests.conftest import github_headers, pr_payload, to_body


def _count(source: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("switchboard_ingest_deliveries_total", {"source": source, "outcome": outcome}) or 0


def test_receive_counts_accepted_duplicate_and_rejected_deliveries(github_source, post_webhook, settings):
    outcomes = [
        ("gh", "accepted"),
        ("gh", "duplicate"),
        ("gh", "rejected_signature"),
        ("gh", "rejected_invalid"),
        ("unknown", "rejected_unknown_source"),
        ("unknown", "rejected_too_large"),
    ]
    before = {key: _count(*key) for key in outcomes}
    body = to_body(pr_payload())
    headers = github_headers(body, delivery="metrics-1")
    assert post_webhook("gh", body, headers).status_code == 202
    assert post_webhook("gh", body, headers).status_code == 200
    assert post_webhook("gh", body, github_headers(body, secret="wrong")).status_code == 401
    not_json = b"not json"
    assert post_webhook("gh", not_json, github_headers(not_json)).status_code == 400
    assert post_webhook("no-such-source", body, headers).status_code == 401
    settings.INGEST_MAX_BODY_BYTES = 10
    assert post_webhook("gh", body, headers).status_code == 413
    assert {key: _count(*key) - before[key] for key in outcomes} == dict.fromkeys(outcomes, 1)
