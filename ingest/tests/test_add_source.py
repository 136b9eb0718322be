from __future__ import annotations

import io
import sys

import pytest
from django.core.management import CommandError, call_command

from ingest.models import Source
from ingest.providers.standard import standard_key


def run(*args: str, stdin: str = "") -> str:
    out = io.StringIO()
    old = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        call_command("add_source", *args, stdout=out)
    finally:
        sys.stdin = old
    return out.getvalue()


def test_add_source_with_routes_prints_the_generated_secret_last(db):
    out = run(
        "gh",
        "--provider",
        "github",
        "--route",
        "pull_request.*",
        "github.prs",
        "review",
        "{repository.full_name}#{pull_request.number}",
        "--route",
        "push",
        "deploys",
    )
    source = Source.objects.get(slug="gh")
    assert out.strip().splitlines()[-1] == source.secret
    assert len(source.secret) >= 40
    assert "/ingest/gh/" in out
    routes = list(source.routes.values_list("event_pattern", "queue", "kind", "title_template"))
    assert routes == [
        ("pull_request.*", "github.prs", "review", "{repository.full_name}#{pull_request.number}"),
        ("push", "deploys", "", ""),
    ]


def test_add_source_standard_generates_a_whsec_base64_secret(db):
    run("std", "--provider", "standard")
    assert len(standard_key(Source.objects.get().secret)) == 32


def test_add_source_stripe_reads_the_secret_from_stdin_and_does_not_print_it(db):
    out = run("billing", "--provider", "stripe", "--secret-stdin", stdin="whsec_from_stripe\n")
    assert Source.objects.get().secret == "whsec_from_stripe"
    assert "whsec_from_stripe" not in out


def test_add_source_stripe_without_a_piped_secret_is_refused(db):
    with pytest.raises(CommandError, match="Stripe"):
        run("billing", "--provider", "stripe")
    assert Source.objects.count() == 0


def test_add_source_with_an_invalid_queue_creates_nothing(db):
    with pytest.raises(CommandError, match="Queue names"):
        run("gh", "--provider", "github", "--route", "*", "bad queue")
    assert Source.objects.count() == 0


def test_add_source_twice_is_refused(db):
    run("gh", "--provider", "github")
    with pytest.raises(CommandError, match="already exists"):
        run("gh", "--provider", "hmac")
