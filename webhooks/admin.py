from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages

from webhooks.models import EVENT_TYPES, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from webhooks.services import webhook_endpoint_create


class WebhookEndpointForm(forms.ModelForm):
    events = forms.MultipleChoiceField(
        choices=[(e, e) for e in EVENT_TYPES], initial=list(EVENT_TYPES), required=True
    )

    class Meta:
        model = WebhookEndpoint
        fields = ("org", "url", "events")


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    """Create through the same service as the API; the secret is shown once, never stored."""

    form = WebhookEndpointForm
    list_display = ("id", "org", "url", "events", "created_at")
    search_fields = ("id", "org__name", "url")

    def get_readonly_fields(self, request: Any, obj: WebhookEndpoint | None = None) -> Any:
        return ("id", "org", "url", "events", "created_at") if obj else ()

    def get_fields(self, request: Any, obj: WebhookEndpoint | None = None) -> Any:
        return ("id", "org", "url", "events", "created_at") if obj else ("org", "url", "events")

    def save_model(self, request: Any, obj: WebhookEndpoint, form: Any, change: bool) -> None:
        if change:
            return  # endpoints are immutable: delete and create a new one
        endpoint, secret = webhook_endpoint_create(
            org=form.cleaned_data["org"],
            url=form.cleaned_data["url"],
            events=form.cleaned_data["events"],
        )
        obj.pk = endpoint.pk
        obj.refresh_from_db()
        messages.warning(request, f"Signing secret of {endpoint.id} (shown only now): {secret}")


class WebhookAttemptInline(admin.TabularInline):
    model = WebhookAttempt
    fields = ("number", "attempted_at", "status_code", "latency_ms", "error")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    """Each event's delivery to each endpoint, with every attempt (status, latency)."""

    list_display = (
        "event",
        "event_type",
        "endpoint",
        "state",
        "attempts",
        "last_status",
        "next_attempt_at",
        "delivered_at",
    )
    list_filter = ("state",)
    search_fields = ("event__id", "event__batch_id", "endpoint__id")
    readonly_fields = (
        "event",
        "endpoint",
        "state",
        "attempts",
        "last_status",
        "next_attempt_at",
        "delivered_at",
    )
    inlines = [WebhookAttemptInline]

    @admin.display(description="type")
    def event_type(self, obj: WebhookDelivery) -> str:
        return obj.event.type

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False
