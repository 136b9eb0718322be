"""Sources and their routes. Secrets are write-only here: the form never renders a stored secret back
(an empty field keeps it), and the change page shows the webhook URL to give the provider plus a
preview of which recent events a route pattern matches."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from events.models import Event
from ingest import providers
from ingest.models import Route, Source
from ingest.routing import render_title

PREVIEW_EVENTS = 20


class SourceForm(forms.ModelForm[Source]):
    new_secret = forms.CharField(
        label="Secret",
        required=False,
        max_length=500,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only: the stored secret is never shown. Leave empty to keep it.",
    )
    rotate = forms.BooleanField(
        label="Keep the current secret as the previous one",
        required=False,
        help_text="With a new secret: both are accepted until you clear the previous one (a rotation).",
    )
    new_previous_secret = forms.CharField(
        label="Previous secret",
        required=False,
        max_length=500,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only. Also accepted while set. Leave empty to keep it.",
    )
    clear_previous_secret = forms.BooleanField(
        required=False, help_text="End a rotation: only the current secret is accepted afterwards."
    )

    class Meta:
        model = Source
        fields = ("slug", "provider", "is_active")

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        source = self.instance
        new_secret = data.get("new_secret") or ""
        provider = providers.PROVIDERS.get(data.get("provider") or "")
        pulled = provider is not None and not provider.accepts_webhooks  # nothing is signed, so no secret
        if not new_secret and not source.secret and not pulled:
            self.add_error("new_secret", "A new source needs its secret.")
            return data
        if new_secret:
            if data.get("rotate") and source.secret and source.secret != new_secret:
                source.previous_secret = source.secret
            source.secret = new_secret
        if data.get("new_previous_secret"):
            source.previous_secret = data["new_previous_secret"]
        if data.get("clear_previous_secret"):
            source.previous_secret = ""
        return data


class RouteInline(admin.TabularInline[Route, Source]):
    model = Route
    extra = 1
    fields = (
        "event_pattern",
        "queue",
        "kind",
        "title_template",
        "fair_key_template",
        "limits",
        "assignee",
        "max_attempts",
        "delay_seconds",
        "priority",
        "is_active",
        "preview",
    )
    readonly_fields = ("preview",)

    @admin.display(description="Try it")
    def preview(self, route: Route) -> str:
        if route.pk is None:
            return "-"
        url = reverse("admin:ingest_source_preview", args=[route.source_id])
        return format_html('<a href="{}?route={}">recent events</a>', url, route.pk)


@admin.register(Source)
class SourceAdmin(admin.ModelAdmin[Source]):
    form = SourceForm
    inlines = [RouteInline]
    list_display = ("slug", "provider", "is_active", "webhook_path", "has_previous_secret", "route_count", "created_at")
    list_filter = ("provider", "is_active")
    search_fields = ("slug",)
    fieldsets = (
        (None, {"fields": ("slug", "provider", "is_active")}),
        ("Signing secret", {"fields": ("new_secret", "rotate", "new_previous_secret", "clear_previous_secret")}),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Source | None = None) -> tuple[str, ...]:
        # Events record the slug they arrived under; renaming would cut them off from their routes.
        return ("slug",) if obj is not None else ()

    def get_queryset(self, request: HttpRequest) -> Any:
        from django.db.models import Count

        return super().get_queryset(request).annotate(_route_count=Count("routes"))

    @admin.display(description="routes", ordering="_route_count")
    def route_count(self, source: Source) -> int:
        return getattr(source, "_route_count", 0)

    @admin.display(description="rotating", boolean=True)
    def has_previous_secret(self, source: Source) -> bool:
        return bool(source.previous_secret)

    def get_urls(self) -> list[URLPattern]:
        preview = path(
            "<int:source_id>/preview/",
            self.admin_site.admin_view(self.preview_view),
            name="ingest_source_preview",
        )
        return [preview, *super().get_urls()]

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        source = context.get("original")
        if source is not None:
            context["webhook_url"] = request.build_absolute_uri(source.webhook_path)
            context["preview_url"] = reverse("admin:ingest_source_preview", args=[source.pk])
        return super().render_change_form(request, context, *args, **kwargs)

    def preview_view(self, request: HttpRequest, source_id: int) -> HttpResponse:
        """Which of the source's last 20 events a pattern (a saved route's, or one typed in) matches, and
        the title each would get."""
        source = get_object_or_404(Source, pk=source_id)
        if not self.has_view_permission(request, source):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        route = None
        # isdigit() alone passes "²" and 5,000-digit strings, which int() refuses (a 500).
        if (route_id := request.GET.get("route", "")).isascii() and route_id.isdigit() and len(route_id) <= 18:
            route = source.routes.filter(pk=int(route_id)).first()
        pattern = request.GET.get("pattern") or (route.event_pattern if route else "*")
        template = request.GET.get("title_template")
        if template is None:
            template = route.title_template if route else ""
        probe = Route(source=source, event_pattern=pattern, title_template=template)
        events = Event.objects.filter(source=source.slug).order_by("-received_at", "-id")[:PREVIEW_EVENTS]
        rows = [
            {
                "event": event,
                "matches": probe.matches(event.type),
                "title": render_title(template, event.payload) if template else "",
            }
            for event in events
        ]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "source": source,
            "route": route,
            "pattern": pattern,
            "title_template": template,
            "rows": rows,
            "match_count": sum(1 for r in rows if r["matches"]),
            "title": f"Try a route pattern on {source.slug}'s recent events",
        }
        return TemplateResponse(request, "admin/ingest/source/preview.html", context)
