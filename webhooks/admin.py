from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages

from boardwalk.errors import BoardwalkError
from webhooks.models import EVENT_TYPES, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from webhooks.services import (
    UPDATABLE_FIELDS,
    webhook_endpoint_create,
    webhook_endpoint_fields_check,
    webhook_endpoint_update,
)


class WebhookEndpointForm(forms.ModelForm):
    event_types = forms.MultipleChoiceField(
        choices=[(e, e) for e in EVENT_TYPES], initial=list(EVENT_TYPES), required=True
    )

    class Meta:
        model = WebhookEndpoint
        fields = ("org", "name", "url", "event_types")

    def clean(self) -> dict[str, Any]:
        """The API's checks (a URL with whitespace in its host, an unknown event type, …)."""
        data = super().clean() or {}
        try:
            data.update(
                webhook_endpoint_fields_check({f: data[f] for f in UPDATABLE_FIELDS if f in data})
            )
        except BoardwalkError as exc:
            field = exc.param if exc.param in UPDATABLE_FIELDS else None
            self.add_error(field, exc.message)
        return data


_SHOWN = ("id", "org", "name", "url", "event_types", "secret_hint", "created_at", "updated_at")


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    """Create and edit through the same services as the API; the secret is shown once."""

    form = WebhookEndpointForm
    list_display = ("id", "org", "name", "url", "event_types", "created_at")
    search_fields = ("id", "org__name", "name", "url")

    def get_readonly_fields(self, request: Any, obj: WebhookEndpoint | None = None) -> Any:
        return ("id", "org", "secret_hint", "created_at", "updated_at") if obj else ()

    def get_fields(self, request: Any, obj: WebhookEndpoint | None = None) -> Any:
        return _SHOWN if obj else ("org", "name", "url", "event_types")

    def save_model(self, request: Any, obj: WebhookEndpoint, form: Any, change: bool) -> None:
        fields = {name: form.cleaned_data[name] for name in UPDATABLE_FIELDS}
        if change:
            webhook_endpoint_update(endpoint=WebhookEndpoint.objects.get(pk=obj.pk), changes=fields)
            obj.refresh_from_db()
            return
        endpoint, secret = webhook_endpoint_create(org=form.cleaned_data["org"], **fields)
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
