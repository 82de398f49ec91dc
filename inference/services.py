"""Writes to the catalog: revisions are immutable, names unique across catalog and
deployments (SPEC §3 decision), so `body.model` always means one thing."""

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


@transaction.atomic
def catalog_model_create(
    *,
    name: str,
    revision: ModelRevision,
    prices: tuple[int, int, int] | None,
    media: list[str] | None = None,
    interactive_prices: tuple[int, int, int] = (0, 0, 0),
) -> CatalogModel:
    """`prices` = (input, cached_input, output) µUSD per million tokens; None = not for batch.
    `interactive_prices` the same for `POST /v1/chat/completions` (0: free)."""
    model_name_check(name=name)
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


def _interactive_fields(prices: tuple[int, int, int]) -> dict[str, int]:
    return dict(zip(INTERACTIVE_PRICE_FIELDS, prices, strict=True))


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
    prices: tuple[int, int, int] | None,
    media: list[str],
    interactive_prices: tuple[int, int, int] | None = None,
) -> None:
    """New batch prices (None = not for batch), media and interactive prices (None: kept);
    accepted batches and requests keep theirs."""
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
        **({} if interactive_prices is None else _interactive_fields(interactive_prices)),
    )


def deployment_update(
    *, deployment: Deployment, revision: ModelRevision, gpu_second_price: int
) -> None:
    """A deployment's revision and price; accepted batches keep the ones they pinned. Its
    name and organization never change (clients and holds refer to them)."""
    Deployment.objects.filter(pk=deployment.pk).update(
        revision=revision, gpu_second_price=gpu_second_price
    )
