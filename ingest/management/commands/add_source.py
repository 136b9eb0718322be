"""manage.py add_source SLUG --provider github [--route PATTERN QUEUE [KIND [TITLE]]]... [--secret-stdin]

Creates a source and its routes. For github, standard and hmac a strong secret is generated
unless one is piped in with --secret-stdin; it is printed once, alone on the last line, for pasting into
the provider's settings. Stripe makes its own secret (whsec_...): pipe it in. A secret is never taken
as an argument, where shell history and process lists would keep it.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from ingest import providers
from ingest.models import Route, Source


class Command(BaseCommand):
    help = "Create a webhook source (POST /ingest/<slug>/) and its routes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--provider", required=True, choices=sorted(providers.PROVIDERS))
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
        spec = providers.get(provider)
        # A pull-only provider's entries are read, not POSTed: nothing is signed, so there is no secret.
        pulled = not spec.accepts_webhooks
        generated = not options["secret_stdin"] and not pulled
        if pulled:
            secret = ""
        elif generated:
            try:
                secret = spec.new_secret()
            except ValueError as exc:  # a provider that makes its own secret (Stripe)
                raise CommandError(str(exc)) from exc
        else:
            secret = sys.stdin.readline().strip()
            if not secret:
                raise CommandError("The secret read from standard input is empty.")
        for route_spec in options["route"]:
            if not 2 <= len(route_spec) <= 4:
                raise CommandError("--route takes PATTERN QUEUE [KIND [TITLE_TEMPLATE]].")
        source = Source(slug=slug, provider=provider, secret=secret, is_active=not options["inactive"])
        routes = [
            Route(
                event_pattern=route_spec[0],
                queue=route_spec[1],
                kind=route_spec[2] if len(route_spec) > 2 else "",
                title_template=route_spec[3] if len(route_spec) > 3 else "",
            )
            for route_spec in options["route"]
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
            self.stdout.write(f"It takes no webhooks: {spec.label}.")
        else:
            self.stdout.write(f"Webhook URL path: {source.webhook_path}  (content type application/json)")
        if generated:
            self.stdout.write("Secret (shown once; give it to the provider):")
            self.stdout.write(secret)
