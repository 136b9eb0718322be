"""Add a recurring schedule: each tick of its cron expression makes one todo, made by the reapers."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from todos.models import CatchUp, Schedule
from todos.schedules import next_tick


class Command(BaseCommand):
    help = "Add a recurring schedule (a 5-field cron expression in a time zone) that makes a todo on each tick."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="Unique name; part of each tick's idempotency key.")
        parser.add_argument("--cron", required=True, help="5 fields: minute hour day-of-month month day-of-week.")
        parser.add_argument("--queue", required=True, help="The queue its todos go to.")
        parser.add_argument("--kind", default="")
        parser.add_argument("--title", default="")
        parser.add_argument("--payload", default="{}", help='JSON, e.g. \'{"report": "daily"}\'.')
        parser.add_argument("--timezone", default="UTC", help="IANA zone the cron is read in (default UTC).")
        parser.add_argument("--priority", type=int, default=0, help="-100 to 100; lower runs first.")
        parser.add_argument("--max-attempts", type=int, default=None, help="Default: the queue's default.")
        parser.add_argument(
            "--catch-up",
            choices=[c.value for c in CatchUp],
            default=CatchUp.LATEST,
            help="After downtime: latest (default) runs only the most recent missed tick, none skips them, "
            "all runs each of them (at most 100).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            payload = json.loads(options["payload"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"--payload is not JSON: {exc}") from exc
        if Schedule.objects.filter(name=options["name"]).exists():
            raise CommandError(f"A schedule named {options['name']!r} exists already.")
        schedule = Schedule(
            name=options["name"],
            cron=options["cron"],
            timezone=options["timezone"],
            queue=options["queue"],
            kind=options["kind"],
            title=options["title"],
            payload=payload,
            priority=options["priority"],
            max_attempts=options["max_attempts"],
            catch_up=options["catch_up"],
        )
        try:
            schedule.full_clean(exclude=["created_at"])
        except ValidationError as exc:
            flags = {"max_attempts": "max-attempts", "catch_up": "catch-up", "timezone": "timezone"}
            raise CommandError(
                "; ".join(f"--{flags.get(k, k)}: {' '.join(v)}" for k, v in exc.message_dict.items())
            ) from exc
        schedule.save()
        first = next_tick(schedule, datetime.now(UTC))
        self.stdout.write(
            f"Schedule {schedule.name} added: {schedule.cron} ({schedule.timezone}) -> {schedule.queue}; "
            f"first run {first:%Y-%m-%dT%H:%M:%SZ}."
            if first
            else f"Schedule {schedule.name} added."
        )
