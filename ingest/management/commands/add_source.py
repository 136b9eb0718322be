"""manage.py add_source SLUG --provider github [--route PATTERN QUEUE [KIND [TITLE]]]... [--secret-stdin]

Creates a webhook source and its routes. For github, standard and hmac a strong secret is generated
unless one is piped in with --secret-stdin; it is printed once, alone on the last line, for pasting into
the provider's settings. Stripe makes its own secret (whsec_...): pipe it in. A secret is never taken
as an argument, where shell history and process lists would keep it.
"""

from __future__ import annotations

import base64
import secrets
import sys
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from ingest.models import Provider, Route, Source


def generate_secret(provider: str) -> str:
    if provider == Provider.STANDARD:
        return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    return secrets.token_urlsafe(32)


class Command(BaseCommand):
    help = "Create a webhook source (POST /ingest/<slug>/) and its routes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--provider", required=True, choices=Provider.values)
        parser.add_argument(
            "--route",
            nargs="+",
            action="append",
            default=[],
            metavar="ARG",
            help="PATTERN QUEUE [KIND [TITLE_TEMPLATE]]; repeat for several routes",
        )
        parser.add_argument("--secret-stdin", action="store_true", help="read the secret from standard input")
        parser.add_argument("--inactive", action="store_true", help="create it switched off")

    def handle(self, *args: Any, **options: Any) -> None:
        slug, provider = options["slug"], options["provider"]
        if Source.objects.filter(slug=slug).exists():
            raise CommandError(f"A source {slug!r} already exists; change it in the admin.")
        # A stream source is read by manage.py consume_stream: no webhook, so no secret to share.
        pulled = provider == Provider.STREAM
        generated = not options["secret_stdin"] and not pulled
        if generated and provider == Provider.STRIPE:
            raise CommandError("Stripe makes the secret (whsec_...): pipe it in with --secret-stdin.")
        secret = "" if pulled else generate_secret(provider) if generated else sys.stdin.readline().strip()
        if not secret and not pulled:
            raise CommandError("The secret read from standard input is empty.")
        for spec in options["route"]:
            if not 2 <= len(spec) <= 4:
                raise CommandError("--route takes PATTERN QUEUE [KIND [TITLE_TEMPLATE]].")
        source = Source(slug=slug, provider=provider, secret=secret, is_active=not options["inactive"])
        routes = [
            Route(
                event_pattern=spec[0],
                queue=spec[1],
                kind=spec[2] if len(spec) > 2 else "",
                title_template=spec[3] if len(spec) > 3 else "",
            )
            for spec in options["route"]
        ]
        try:
            source.full_clean(exclude=["secret"] if pulled else None)
            for route in routes:
                route.full_clean(exclude=["source"])
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        with transaction.atomic():
            source.save()
            for route in routes:
                route.source = source
                route.save()
        self.stdout.write(f"Source {slug} ({provider}) with {len(routes)} route(s).")
        if pulled:
            self.stdout.write(f"Consume it with: manage.py consume_stream --stream NAME --group GROUP --source {slug}")
        else:
            self.stdout.write(f"Webhook URL path: {source.webhook_path}  (content type application/json)")
        if generated:
            self.stdout.write("Secret (shown once; give it to the provider):")
            self.stdout.write(secret)
