from __future__ import annotations

import datetime as dt

from django.contrib import admin

from batches.models import Batch
from boardwalk.admin import ReadOnlyAdminMixin


@admin.register(Batch)
class BatchAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only and content-free: counts, states, money and ids."""

    # Few, short columns, so the list fits beside the admin's sidebar and its filters from
    # 1280 px up without cutting a cell (tests/console/test_browser.py); the detail page has
    # every field, billing and expiry included (billing is a filter too).
    list_display = (
        "id",
        "org_name",
        "model_label",
        "status",
        "items",
        "charge",
        "created",
        "duration",
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

    @admin.display(description="org", ordering="org__name")
    def org_name(self, obj: Batch) -> str:
        return obj.org.name

    @admin.display(description="model", ordering="model_name")
    def model_label(self, obj: Batch) -> str:
        return f"{obj.model_name} (deployment)" if obj.deployment_id else obj.model_name

    @admin.display(description="ok / failed / all")
    def items(self, obj: Batch) -> str:
        return f"{obj.completed} / {obj.failed} / {obj.total}"

    @admin.display(description="charge (micro-USD)", ordering="charge_microusd")
    def charge(self, obj: Batch) -> int | None:
        return obj.charge_microusd

    @admin.display(description="created (UTC)", ordering="created_at")
    def created(self, obj: Batch) -> str:
        return f"{obj.created_at.astimezone(dt.UTC):%Y-%m-%d %H:%M}"

    @admin.display(description="took")
    def duration(self, obj: Batch) -> str:
        ended = obj.completed_at or obj.cancelled_at or obj.failed_at or obj.expired_at
        return "—" if ended is None else str(ended - obj.created_at).split(".")[0]
