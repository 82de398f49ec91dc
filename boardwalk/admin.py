"""Staff console for organizations and keys. Key secrets are shown once, on creation."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Q

from boardwalk.models import ALL_SCOPES, ApiKey, Organization
from boardwalk.services import api_key_create, api_key_revoke, org_create

admin.site.site_header = "Boardwalk console"
admin.site.site_title = "Boardwalk"
admin.site.index_title = "Operations"
# Links to the staff console (usage dashboard, workers) above the model lists.
admin.site.index_template = "admin/boardwalk_index.html"


class ReadOnlyAdminMixin:
    """For records staff read but never write (facts, history): no add, change or delete."""

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    can_delete = False
    fields = ("prefix", "name", "scopes", "created_at", "revoked_at", "last_used_at")
    readonly_fields = fields
    show_change_link = True

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    """billing.admin extends this with credit (the foundation imports no app above it)."""

    list_display = ("name", "id", "active_keys", "created_at")
    search_fields = ("name", "id")
    readonly_fields = ("id", "created_at")
    inlines = [ApiKeyInline]

    def get_queryset(self, request: Any) -> Any:
        # Counted in the list query itself: no query per row.
        return (
            super()
            .get_queryset(request)
            .annotate(keys=Count("api_keys", filter=Q(api_keys__revoked_at__isnull=True)))
        )

    @admin.display(description="active keys", ordering="keys")
    def active_keys(self, obj: Any) -> int:
        return obj.keys

    def save_model(self, request: Any, obj: Organization, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        obj.pk = org_create(name=form.cleaned_data["name"]).pk

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False  # the ledger and the batches refer to it


class ApiKeyCreateForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=[(s, s) for s in ALL_SCOPES],
        widget=forms.CheckboxSelectMultiple,
        initial=list(ALL_SCOPES),
    )

    class Meta:
        model = ApiKey
        fields = ("org", "name", "scopes")


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "org", "name", "scopes", "created_at", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter), "last_used_at")
    list_select_related = ("org",)
    search_fields = ("prefix", "org__name", "name")
    actions = ["revoke"]

    def get_form(self, request: Any, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = ApiKeyCreateForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request: Any, obj: Any = None) -> Any:
        if obj is None:
            return ()
        return ("org", "prefix", "scopes", "created_at", "revoked_at", "last_used_at")

    def save_model(self, request: Any, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        issued = api_key_create(org=obj.org, scopes=form.cleaned_data["scopes"], name=obj.name)
        obj.pk = issued.key.pk
        obj.prefix = issued.key.prefix
        messages.warning(request, f"Copy this key now, it will not be shown again: {issued.secret}")

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: Any, queryset: Any) -> None:
        for key in queryset:
            api_key_revoke(key=key)
        messages.success(request, f"Revoked {queryset.count()} key(s).")

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False  # revoke instead: keys stay for the audit trail
