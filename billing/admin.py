"""Staff console for credit: grants through billing.services, the ledger and the usage
events read-only (append-only tables: nothing here edits or deletes them)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.template.response import TemplateResponse
from django.utils.html import format_html

from billing.models import LedgerEntry, UsageEvent
from billing.selectors import credit_for_org
from billing.services import credit_grant
from boardwalk.admin import OrganizationAdmin, ReadOnlyAdminMixin
from boardwalk.errors import BoardwalkError
from boardwalk.models import Organization


@admin.register(LedgerEntry)
class LedgerEntryAdmin(admin.ModelAdmin):
    """Append-only: staff add grants; nothing is edited or deleted."""

    # batch_id names a batch, request_id an interactive request (req_…); a grant neither.
    list_display = (
        "created_at",
        "org",
        "kind",
        "amount_microusd",
        "batch_id",
        "request_id",
        "memo",
    )
    list_filter = ("kind", "created_at")
    list_select_related = ("org",)
    search_fields = ("org__name", "org__id", "batch_id", "request_id", "memo")
    date_hierarchy = "created_at"

    def get_fields(self, request: Any, obj: Any = None) -> Any:
        if obj is None:
            return ("org", "amount_microusd", "memo")
        return (
            "org",
            "kind",
            "amount_microusd",
            "batch_id",
            "request_id",
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


@admin.register(UsageEvent)
class UsageEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The metering events, for audits: ids, kinds and integer quantities only."""

    # Class interactive names its request in request_id (its answer's usage is its receipt),
    # class batch its batch in batch_id.
    list_display = (
        "created_at",
        "org",
        "usage_class",
        "batch_id",
        "request_id",
        "item_id",
        "attempt",
        "kind",
        "quantity",
    )
    list_filter = ("usage_class", "kind", "created_at")
    list_select_related = ("org",)
    search_fields = (
        "batch_id",
        "request_id",
        "org__name",
        "org__id",
        "revision_id",
        "deployment_id",
    )
    date_hierarchy = "created_at"
    # A million rows: an exact count on every page would cost more than the page.
    show_full_result_count = False


class GrantCreditForm(forms.Form):
    amount_microusd = forms.IntegerField(min_value=1, label="Amount (µUSD)")
    memo = forms.CharField(max_length=200, required=False, help_text="Ids and reasons only.")


class OrganizationCreditAdmin(OrganizationAdmin):
    """Organizations with their credit and a grant action (registered here, not in
    boardwalk.admin: the foundation imports nothing from billing)."""

    actions = ["grant_credit"]

    def get_readonly_fields(self, request: Any, obj: Any = None) -> Any:
        base = tuple(super().get_readonly_fields(request, obj))
        return base if obj is None else (*base, "credit", "usage")

    @admin.display(description="credit (µUSD)")
    def credit(self, obj: Organization) -> str:
        credit = credit_for_org(org_id=obj.id)
        return f"balance {credit.balance} · held {credit.held} · available {credit.available}"

    @admin.display(description="usage")
    def usage(self, obj: Organization) -> str:
        return format_html(
            '<a href="/admin/usage/?org={}">usage dashboard</a> · '
            '<a href="/admin/billing/ledgerentry/?org__id__exact={}">ledger</a>',
            obj.id,
            obj.id,
        )

    @admin.action(description="Grant credit to the selected organizations")
    def grant_credit(self, request: Any, queryset: Any) -> TemplateResponse | None:
        form = GrantCreditForm(request.POST if "apply" in request.POST else None)
        if form.is_bound and form.is_valid():
            amount = form.cleaned_data["amount_microusd"]
            try:
                for org in queryset:
                    credit_grant(
                        org=org, amount_microusd=amount, memo=form.cleaned_data["memo"] or "admin"
                    )
            except BoardwalkError as exc:
                self.message_user(request, exc.message, messages.ERROR)
                return None
            self.message_user(request, f"Granted {amount} µUSD to {queryset.count()} org(s).")
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": "Grant credit",
            "orgs": queryset,
            "form": form,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/billing/grant_credit.html", context)


admin.site.unregister(Organization)
admin.site.register(Organization, OrganizationCreditAdmin)
