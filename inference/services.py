"""Writes to the catalog: revisions are immutable, names unique across catalog and
deployments (docs/API.md "Models and deployments"), so `body.model` always means one thing."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from boardwalk.codes import ErrorCode
from boardwalk.errors import Conflict, InvalidRequest
from boardwalk.models import Organization
from inference.models import MODALITIES, CatalogModel, Deployment, ModelRevision
from inference.tokenization import runnable_media_for


def revision_create(**fields: Any) -> ModelRevision:
    """A new revision. It may publish `image` or `audio` only where the engine can run them:
    its architecture has an encoder the engine drives and its processor handles that media."""
    revision = ModelRevision(**fields)
    unknown = set(revision.modalities) - set(MODALITIES)
    if unknown:
        raise InvalidRequest(
            f"modalities are any of text, image, audio; got {sorted(revision.modalities)}",
            code=ErrorCode.INVALID_MODALITIES,
            param="modalities",
        )
    media = set(revision.modalities) - {"text"}
    missing = media - runnable_media_for(revision)
    if missing:
        raise InvalidRequest(
            f"the revision cannot publish {', '.join(sorted(missing))}: its model and processor "
            "do not handle it",
            code=ErrorCode.UNSUPPORTED_MODALITY,
            param="modalities",
        )
    revision.save(force_insert=True)
    return revision


def _name_taken(name: str) -> bool:
    return (
        CatalogModel.objects.filter(name=name).exists()
        or Deployment.objects.filter(name=name).exists()
    )


def model_name_check(*, name: str) -> None:
    """Raise Conflict if `name` already means a catalog model or a deployment (the admin's
    forms ask before they create; the create services check again in their transaction)."""
    if _name_taken(name):
        raise Conflict(f"The model name {name!r} is already used.", code=ErrorCode.NAME_TAKEN)


Prices = tuple[int, int, int]  # (input, cached_input, output) µUSD per million tokens


def catalog_prices_check(*, prices: Prices | None, interactive_prices: Prices | None) -> None:
    """Raise InvalidRequest unless the prices can be set together: none negative, and each
    interactive price at least the batch one, since `service_tier: "flex"` pays the batch
    prices and must never cost more than the default tier (docs/BILLING.md). The admin's form
    asks before it saves; the writes below check again."""
    for label, group in (("batch", prices), ("interactive", interactive_prices)):
        if group is not None and min(group) < 0:
            raise InvalidRequest(
                f"{label} prices are µUSD per million tokens, never negative; got {list(group)}",
                code=ErrorCode.INVALID_PRICES,
            )
    if prices is None or interactive_prices is None:
        return
    cheaper = [
        f"{kind} {interactive} < {batch}"
        for kind, interactive, batch in zip(
            ("input", "cached_input", "output"), interactive_prices, prices, strict=True
        )
        if interactive < batch
    ]
    if cheaper:
        raise InvalidRequest(
            "each interactive price must be at least the batch price, which flex requests pay "
            f"(interactive vs batch: {', '.join(cheaper)}): raise the interactive prices or "
            "lower the batch ones",
            code=ErrorCode.INVALID_PRICES,
        )


@transaction.atomic
def catalog_model_create(
    *,
    name: str,
    revision: ModelRevision,
    prices: Prices | None,
    media: list[str] | None = None,
    interactive_prices: Prices | None = None,
) -> CatalogModel:
    """`prices` = (input, cached_input, output) µUSD per million tokens; None = not for batch.
    `interactive_prices` the same for `POST /v1/chat/completions`; None = not offered there."""
    model_name_check(name=name)
    catalog_prices_check(prices=prices, interactive_prices=interactive_prices)
    price_input, price_cached, price_output = prices or (0, 0, 0)
    return CatalogModel.objects.create(
        name=name,
        revision=revision,
        batch_enabled=prices is not None,
        price_input=price_input,
        price_cached_input=price_cached,
        price_output=price_output,
        batch_media=media or [],
        **_interactive_fields(interactive_prices),
    )


INTERACTIVE_PRICE_FIELDS = (
    "price_input_interactive",
    "price_cached_input_interactive",
    "price_output_interactive",
)


def _interactive_fields(prices: Prices | None) -> dict[str, int | None]:
    return dict(zip(INTERACTIVE_PRICE_FIELDS, prices or (None, None, None), strict=True))


def catalog_model_set_revision(*, model: CatalogModel, revision: ModelRevision) -> None:
    """Point a catalog name at a new revision; accepted batches keep the one they pinned."""
    CatalogModel.objects.filter(pk=model.pk).update(revision=revision)


@transaction.atomic
def deployment_create(
    *, org: Organization, name: str, revision: ModelRevision, gpu_second_price: int
) -> Deployment:
    model_name_check(name=name)
    return Deployment.objects.create(
        org=org, name=name, revision=revision, gpu_second_price=gpu_second_price
    )


def catalog_model_update(
    *,
    model: CatalogModel,
    prices: Prices | None,
    media: list[str],
    interactive_prices: Prices | None,
) -> None:
    """New batch prices (None = not for batch), media and interactive prices (None = not
    offered interactively); accepted batches and requests keep theirs."""
    catalog_prices_check(prices=prices, interactive_prices=interactive_prices)
    price_input, price_cached, price_output = prices or (
        model.price_input,
        model.price_cached_input,
        model.price_output,
    )
    CatalogModel.objects.filter(pk=model.pk).update(
        batch_enabled=prices is not None,
        price_input=price_input,
        price_cached_input=price_cached,
        price_output=price_output,
        batch_media=media,
        **_interactive_fields(interactive_prices),
    )


def model_set_enabled(*, target: CatalogModel | Deployment, enabled: bool) -> None:
    """Disable (or enable again) a catalog model or deployment: disabled, it takes no new
    batch and no interactive request (inference.selectors.model_resolve); accepted batches
    keep running on the revision they pinned. Prices, media and revision are kept."""
    type(target).objects.filter(pk=target.pk).update(enabled=enabled)


def deployment_update(
    *, deployment: Deployment, revision: ModelRevision, gpu_second_price: int
) -> None:
    """A deployment's revision and price; accepted batches keep the ones they pinned. Its
    name and organization never change (clients and holds refer to them)."""
    Deployment.objects.filter(pk=deployment.pk).update(
        revision=revision, gpu_second_price=gpu_second_price
    )
