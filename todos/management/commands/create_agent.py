"""Make an agent and print its API token, alone on the last line (the only time it is shown)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from todos.globs import collapse_stars
from todos.models import Agent, new_webhook_secret, validate_scope


def _scopes(value: str) -> list[str]:
    return [collapse_stars(s.strip()) for s in value.split(",") if s.strip()]


class Command(BaseCommand):
    help = "Create an agent with claim (and create) queue scopes; prints its token on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="The agent's name: its identity as the owner of its claims.")
        parser.add_argument("--queues", required=True, help="Claim scopes: queue names or globs, comma-separated.")
        parser.add_argument("--create-queues", help="Create scopes (default: the claim scopes).")
        parser.add_argument("--owner", help="Username of the person responsible for the agent.")
        parser.add_argument("--can-retry", action="store_true", help="May retry dead-letters (operator retry).")
        parser.add_argument(
            "--can-manage", action="store_true", help="May pause, resume and limit the queues in its scopes."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        claim = _scopes(options["queues"])
        create = _scopes(options["create_queues"]) if options["create_queues"] is not None else claim
        if not claim:
            raise CommandError("--queues needs at least one queue name or glob.")
        agent = Agent(
            name=options["name"],
            claim_scopes=claim,
            create_scopes=create,
            can_retry_dead_letters=options["can_retry"],
            can_manage_queues=options["can_manage"],
        )
        if options["owner"]:
            try:
                agent.owner = get_user_model().objects.get_by_natural_key(options["owner"])
            except get_user_model().DoesNotExist as exc:
                raise CommandError(f"No user {options['owner']!r}.") from exc
        token = agent.set_new_token()
        agent.webhook_secret = new_webhook_secret()
        for scope in sorted({*claim, *create}):
            try:
                validate_scope(scope)
            except ValidationError as exc:
                raise CommandError(f"{scope!r}: {' '.join(exc.messages)}") from exc
        try:
            agent.full_clean()
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from exc
        agent.save()
        self.stderr.write(
            f"Agent {agent.name} created (claims {', '.join(claim)}; creates in {', '.join(create) or 'nothing'}). "
            "Its token is shown once, below; only its hash is stored.\n"
            f"Its webhook_secret, which signs the callbacks of the todos it creates (docs/producers.md): "
            f"{agent.webhook_secret}"
        )
        self.stdout.write(token)
