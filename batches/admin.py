from __future__ import annotations

from django.contrib import admin

from batches.models import Batch
from boardwalk.admin import ReadOnlyAdminMixin


@admin.register(Batch)
class BatchAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only and content-free: counts, states, money and ids."""

    list_display = (
        "id",
        "org",
        "model_name",
        "status",
        "total",
        "completed",
        "failed",
        "billing",
        "charge_microusd",
        "created_at",
        "duration",
        "expires_at",
    )
    list_filter = ("status", "billing", "model_name", "created_at")
    list_select_related = ("org",)
    search_fields = ("id", "org__name", "org__id", "input_file__id")
    date_hierarchy = "created_at"
    fields = (
        "id",
        "org",
        "status",
        "outcome",
        "model_name",
        "revision",
        "deployment",
        "billing",
        "price_input",
        "price_cached_input",
        "price_output",
        "gpu_second_price",
        "total",
        "completed",
        "failed",
        "hold_microusd",
        "charge_microusd",
        "usage",
        "errors",
        "input_file",
        "output_file",
        "error_file",
        "created_at",
        "expires_at",
        "finalizing_at",
        "cancelling_at",
        "completed_at",
        "cancelled_at",
        "failed_at",
        "expired_at",
    )
    readonly_fields = (*fields, "duration")

    @admin.display(description="took")
    def duration(self, obj: Batch) -> str:
        ended = obj.completed_at or obj.cancelled_at or obj.failed_at or obj.expired_at
        return "—" if ended is None else str(ended - obj.created_at).split(".")[0]
