from __future__ import annotations

from typing import Any

from django.contrib import admin

from files.models import File


@admin.register(File)
class FileAdmin(admin.ModelAdmin):
    """Metadata only: content is encrypted and never shown here."""

    list_display = (
        "id",
        "org",
        "purpose",
        "status",
        "bytes",
        "line_count",
        "model",
        "created_at",
        "expires_at",
    )
    list_filter = ("purpose", "status", "created_at")
    list_select_related = ("org",)
    search_fields = ("id", "org__name", "org__id")
    fields = (
        "id",
        "org",
        "purpose",
        "status",
        "filename",
        "bytes",
        "line_count",
        "model",
        "sha256",
        "key_id",
        "created_at",
        "expires_at",
        "deleted_at",
    )
    readonly_fields = fields

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False
