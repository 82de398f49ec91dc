from __future__ import annotations

from typing import Any

from django.contrib import admin

from inference.models import CatalogModel, Deployment, ModelRevision


@admin.register(ModelRevision)
class ModelRevisionAdmin(admin.ModelAdmin):
    list_display = ("id", "label", "context_length", "dtype", "modalities", "created_at")
    search_fields = ("id", "label")

    def get_readonly_fields(self, request: Any, obj: Any = None) -> Any:
        # Revisions are immutable once created: a change is a new revision.
        if obj is None:
            return ("id", "created_at")
        return [f.name for f in ModelRevision._meta.fields]


@admin.register(CatalogModel)
class CatalogModelAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "revision",
        "batch_enabled",
        "price_input",
        "price_cached_input",
        "price_output",
    )
    list_filter = ("batch_enabled",)
    search_fields = ("name",)


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ("name", "org", "revision", "gpu_second_price", "created_at")
    search_fields = ("name", "org__name")
    list_filter = ("org",)
