"""Configured webhook senders (Source) and how their events become todos (Route)."""

from __future__ import annotations

from fnmatch import fnmatchcase

from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.urls import reverse

from ingest import providers
from todos.limits import MAX_DELAY_SECONDS
from todos.models import PRIORITY_MAX, PRIORITY_MIN, validate_limit_name, validate_queue_name


class Source(models.Model):
    """A sender that POSTs signed deliveries to /ingest/<slug>/.

    The secret is stored as given: verifying an HMAC needs the key itself, so it cannot be hashed like
    an agent's token. It is never shown back by the admin, logged, or copied onto events.
    """

    slug = models.SlugField(max_length=100, unique=True, help_text="The last part of the webhook URL.")
    # A callable: the registry (ingest/providers/) is the list, so a new provider needs no migration.
    provider = models.CharField(max_length=20, choices=providers.choices)
    secret = models.CharField(max_length=500, help_text="The webhook signing secret shared with the provider.")
    previous_secret = models.CharField(
        max_length=500,
        blank=True,
        default="",
        help_text="Also accepted while a rotation is under way; clear it once the provider uses the new secret.",
    )
    is_active = models.BooleanField(default=True, help_text="An inactive source answers 404 and stores nothing.")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        # A non-field error: the admin form edits the secrets through write-only fields of other names.
        provider = providers.PROVIDERS.get(self.provider)
        if provider is None:
            return  # the field's choices refuse it
        for label, value in (("secret", self.secret), ("previous secret", self.previous_secret)):
            if value:
                try:
                    provider.check_secret(value)
                except ValueError as exc:
                    raise ValidationError(f"The {label}: {exc}") from exc

    def secrets(self) -> list[str]:
        """The secrets a signature may be made with: the current one, then the one being rotated out."""
        return [s for s in (self.secret, self.previous_secret) if s]

    @property
    def webhook_path(self) -> str:
        return reverse("ingest:receive", args=[self.slug])


class Route(models.Model):
    """Each active route whose pattern matches an event's type makes one todo for that event."""

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="routes")
    event_pattern = models.CharField(
        max_length=200, help_text="A glob on the event type, e.g. pull_request.* or * (case-sensitive)."
    )
    queue = models.CharField(max_length=200, validators=[validate_queue_name])
    kind = models.CharField(max_length=100, blank=True, default="")
    title_template = models.CharField(
        max_length=500,
        blank=True,
        default="",
        help_text="Dotted paths into the payload in braces, e.g. {repository.full_name}#{pull_request.number}. "
        "A missing path renders empty; {{ and }} are literal braces.",
    )
    fair_key_template = models.CharField(
        max_length=500,
        blank=True,
        default="",
        help_text="The todos' fair_key, filled like the title, e.g. {repository.full_name}: on a fair queue, each "
        "key takes its share of claims.",
    )
    # Named limits (issue 31) its todos name; comma-separated in the admin.
    limits = ArrayField(
        models.CharField(max_length=100, validators=[validate_limit_name]),
        size=4,
        default=list,
        blank=True,
        help_text="Named limits its todos are held by (PUT /api/v1/limits/<name>/), e.g. openai.",
    )
    assignee = models.CharField(max_length=100, null=True, blank=True, help_text="Only this agent may claim the todos.")
    max_attempts = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="Empty: the queue's default."
    )
    # blank: a form that leaves them out (an older admin page, a script) gets the defaults.
    delay_seconds = models.PositiveIntegerField(
        default=0,
        blank=True,
        validators=[MaxValueValidator(MAX_DELAY_SECONDS)],
        help_text="Seconds after the delivery before the todo may run (0: at once). The todo waits as scheduled.",
    )
    priority = models.SmallIntegerField(
        default=0,
        blank=True,
        validators=[MinValueValidator(PRIORITY_MIN), MaxValueValidator(PRIORITY_MAX)],
        help_text="-100 to 100; lower runs first.",
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(max_attempts__isnull=True) | Q(max_attempts__gte=1), name="route_max_attempts_positive"
            ),
            models.CheckConstraint(
                condition=Q(delay_seconds__lte=MAX_DELAY_SECONDS), name="route_delay_at_most_a_year"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX), name="route_priority_range"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.source_id}: {self.event_pattern} -> {self.queue}"

    def matches(self, event_type: str) -> bool:
        return fnmatchcase(event_type, self.event_pattern)
