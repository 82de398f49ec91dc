from __future__ import annotations

from typing import Any

from django.contrib import admin

from billing.models import LedgerEntry
from billing.services import credit_grant


@admin.register(LedgerEntry)
class LedgerEntryAdmin(admin.ModelAdmin):
    """Append-only: staff add grants; nothing is edited or deleted."""

    list_display = ("created_at", "org", "kind", "amount_microusd", "batch_id", "memo")
    list_filter = ("kind",)
    search_fields = ("org__name", "batch_id", "memo")

    def get_fields(self, request: Any, obj: Any = None) -> Any:
        if obj is None:
            return ("org", "amount_microusd", "memo")
        return (
            "org",
            "kind",
            "amount_microusd",
            "batch_id",
            "idempotency_key",
            "memo",
            "created_at",
        )

    def get_readonly_fields(self, request: Any, obj: Any = None) -> Any:
        return () if obj is None else self.get_fields(request, obj)

    def save_model(self, request: Any, obj: LedgerEntry, form: Any, change: bool) -> None:
        if change:
            return
        entry = credit_grant(
            org=obj.org, amount_microusd=obj.amount_microusd, memo=obj.memo or "admin grant"
        )
        obj.pk = entry.pk

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return obj is None
