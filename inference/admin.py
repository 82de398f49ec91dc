"""Staff console for the catalog: every write goes through inference.services, so the admin
keeps the rules the API and the commands keep (one name means one thing,
docs/API.md "Models and deployments")."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin

from boardwalk.errors import BoardwalkError
from inference.dialects import DIALECTS
from inference.inspection import InspectionRefused, model_inspect
from inference.models import CatalogModel, Deployment, ModelRevision
from inference.services import (
    INTERACTIVE_PRICE_FIELDS,
    catalog_model_create,
    catalog_model_set_revision,
    catalog_model_update,
    catalog_prices_check,
    deployment_create,
    deployment_update,
    model_name_check,
    model_set_enabled,
    revision_create,
)


class _NewNameForm(forms.ModelForm):
    """Refuses a name the catalog or a deployment already uses, as the services would."""

    def clean_name(self) -> str:
        name = self.cleaned_data["name"].strip()
        try:
            model_name_check(name=name)
        except BoardwalkError as exc:
            raise forms.ValidationError(exc.message) from exc
        return name


class ModelRevisionForm(forms.ModelForm):
    """Checks the directory the way `manage.py model inspect` does (inference.inspection):
    a revision the engine would refuse cannot be created here either."""

    dialect = forms.CharField(
        required=False,
        help_text="Blank: the dialect found in the chat template (docs/API.md "
        '"Model dialects"); or one of ' + ", ".join(DIALECTS) + ".",
    )

    tensor_parallel_size = forms.IntegerField(
        min_value=1,
        initial=1,
        required=False,
        help_text=ModelRevision._meta.get_field("tensor_parallel_size").help_text,
    )

    class Meta:
        model = ModelRevision
        fields = (
            "label",
            "weights",
            "weights_revision",
            "tokenizer",
            "chat_template",
            "context_length",
            "dtype",
            "modalities",
            "dialect",
            "tensor_parallel_size",
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        data["tensor_parallel_size"] = data.get("tensor_parallel_size") or 1
        weights, context = data.get("weights"), data.get("context_length")
        if not weights or not context:
            return data
        try:
            found = model_inspect(
                weights,
                context_length=context,
                dtype=data.get("dtype") or "auto",
                tensor_parallel_size=data["tensor_parallel_size"],
                dialect=data.get("dialect") or None,
            )
        except InspectionRefused as exc:
            raise forms.ValidationError(f"This model cannot be served: {exc}") from exc
        data["dialect"] = found.dialect
        return data


@admin.register(ModelRevision)
class ModelRevisionAdmin(admin.ModelAdmin):
    form = ModelRevisionForm
    list_display = (
        "id",
        "label",
        "context_length",
        "dtype",
        "tensor_parallel_size",
        "served_by",
        "modalities",
        "created_at",
    )
    search_fields = ("id", "label", "engine_url", "engine_model")
    list_filter = ("dtype",)

    def get_readonly_fields(self, request: Any, obj: Any = None) -> Any:
        # Revisions are immutable once created: a change is a new revision.
        if obj is None:
            return ("id", "created_at")
        return [f.name for f in ModelRevision._meta.fields]

    @admin.display(description="served by")
    def served_by(self, obj: ModelRevision) -> str:
        """The workers' own engine, or the external server's model and address (its key
        is an environment variable's name, never shown here)."""
        if not obj.is_external:
            return "workers' engine"
        return f"external: {obj.engine_model} at {obj.engine_url} (≤ {obj.max_in_flight} in flight)"

    def save_model(self, request: Any, obj: ModelRevision, form: Any, change: bool) -> None:
        if change:
            return
        fields = {k: v for k, v in form.cleaned_data.items() if k not in ("id", "created_at")}
        obj.pk = revision_create(**fields).pk


def _catalog_prices(data: dict[str, Any]) -> tuple[Any, Any]:
    """(batch prices or None, interactive prices or None) of a catalog form's data."""
    batch = (data.get("price_input"), data.get("price_cached_input"), data.get("price_output"))
    interactive = tuple(data.get(name) for name in INTERACTIVE_PRICE_FIELDS)
    if None in interactive and any(p is not None for p in interactive):
        raise forms.ValidationError(
            "Give all three interactive prices, or none (the model is then not offered "
            "interactively)."
        )
    return (batch if data.get("batch_enabled") else None), (
        None if None in interactive else interactive
    )


class CatalogModelForm(forms.ModelForm):
    """Checks the prices as inference.services.catalog_prices_check does, before saving."""

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            batch, interactive = _catalog_prices(data)
            catalog_prices_check(prices=batch, interactive_prices=interactive)
        except BoardwalkError as exc:
            raise forms.ValidationError(exc.message) from exc
        return data


class CatalogModelCreateForm(_NewNameForm, CatalogModelForm):
    class Meta:
        model = CatalogModel
        fields = (
            "name",
            "revision",
            "batch_enabled",
            "price_input",
            "price_cached_input",
            "price_output",
            "batch_media",
            *INTERACTIVE_PRICE_FIELDS,
        )


@admin.register(CatalogModel)
class CatalogModelAdmin(admin.ModelAdmin):
    form = CatalogModelForm
    list_display = (
        "name",
        "revision",
        "enabled",
        "batch_enabled",
        "price_input",
        "price_cached_input",
        "price_output",
        "price_output_interactive",
        "created_at",
    )
    list_filter = ("enabled", "batch_enabled")
    list_select_related = ("revision",)
    search_fields = ("name", "revision__id", "revision__label")

    def get_form(self, request: Any, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = CatalogModelCreateForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request: Any, obj: Any = None) -> Any:
        # Clients target the name: renaming would silently re-point their files.
        return ("created_at",) if obj is None else ("name", "created_at")

    def save_model(self, request: Any, obj: CatalogModel, form: Any, change: bool) -> None:
        data = form.cleaned_data
        prices, interactive = _catalog_prices(data)  # µUSD per million tokens
        media = list(data.get("batch_media") or [])
        if not change:
            obj.pk = catalog_model_create(
                name=data["name"],
                revision=data["revision"],
                prices=prices,
                media=media,
                interactive_prices=interactive,
            ).pk
            return
        if "revision" in form.changed_data:
            catalog_model_set_revision(model=obj, revision=data["revision"])
        catalog_model_update(model=obj, prices=prices, media=media, interactive_prices=interactive)
        if "enabled" in form.changed_data:
            model_set_enabled(target=obj, enabled=data["enabled"])


class DeploymentCreateForm(_NewNameForm):
    class Meta:
        model = Deployment
        fields = ("name", "org", "revision", "gpu_second_price")


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ("name", "org", "revision", "gpu_second_price", "enabled", "created_at")
    search_fields = ("name", "org__name", "id")
    list_filter = ("org", "enabled")
    list_select_related = ("org", "revision")

    def get_form(self, request: Any, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = DeploymentCreateForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request: Any, obj: Any = None) -> Any:
        return ("id", "created_at") if obj is None else ("id", "name", "org", "created_at")

    def save_model(self, request: Any, obj: Deployment, form: Any, change: bool) -> None:
        data = form.cleaned_data
        if not change:
            obj.pk = deployment_create(
                org=data["org"],
                name=data["name"],
                revision=data["revision"],
                gpu_second_price=data["gpu_second_price"],
            ).pk
            return
        deployment_update(
            deployment=obj, revision=data["revision"], gpu_second_price=data["gpu_second_price"]
        )
        if "enabled" in form.changed_data:
            model_set_enabled(target=obj, enabled=data["enabled"])
