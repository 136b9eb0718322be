"""Retention per state: `manage.py purge [--done-days N] [--dead-days N] [--cancelled-days N] [--dry-run]
[--batch N]`."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from todos import retention


class Command(BaseCommand):
    help = (
        "Delete done todos older than RETENTION_DONE_DAYS, dead-letters older than RETENTION_DEAD_DAYS, "
        "cancelled todos older than RETENTION_CANCELLED_DAYS, and "
        "events older than the done window with no todo left, and queues with no work and no controls, "
        "in small batches."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--done-days", type=float, default=None, help="Override RETENTION_DONE_DAYS.")
        parser.add_argument("--dead-days", type=float, default=None, help="Override RETENTION_DEAD_DAYS.")
        parser.add_argument("--cancelled-days", type=float, default=None, help="Override RETENTION_CANCELLED_DAYS.")
        parser.add_argument("--batch", type=int, default=None, help="Rows per delete (PURGE_BATCH_SIZE).")
        parser.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        done_days = options["done_days"] if options["done_days"] is not None else settings.RETENTION_DONE_DAYS
        dead_days = options["dead_days"] if options["dead_days"] is not None else settings.RETENTION_DEAD_DAYS
        cancelled_days = (
            options["cancelled_days"] if options["cancelled_days"] is not None else settings.RETENTION_CANCELLED_DAYS
        )
        try:
            result = retention.purge(
                done_days=done_days,
                dead_days=dead_days,
                cancelled_days=cancelled_days,
                batch=options["batch"],
                dry_run=options["dry_run"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        verb = "would delete" if result.dry_run else "deleted"
        self.stdout.write(f"done todos older than {done_days:g} days: {verb} {result.done}")
        self.stdout.write(f"dead-letters older than {dead_days:g} days: {verb} {result.dead}")
        self.stdout.write(f"cancelled todos older than {cancelled_days:g} days: {verb} {result.cancelled}")
        self.stdout.write(f"events older than {done_days:g} days with no todo left: {verb} {result.events}")
        self.stdout.write(f"queues with no work and no controls: {verb} {result.queues}")
