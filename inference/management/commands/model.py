"""Serve your own models: `manage.py model inspect|add|list|set-revision|disable`.

Every subcommand takes `--json` (one JSON object on stdout: the result, or `{"error": …}`),
exits 1 with a message that says what to change on any refusal, and writes through
`inference.services`, so the catalog's rules hold as they do in the admin.
"""

from __future__ import annotations

import json as jsonlib
from argparse import ArgumentParser
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from boardwalk.errors import BoardwalkError
from boardwalk.selectors import organization_by_id_or_name
from inference.inspection import Inspection, InspectionRefused, machine_refusal, model_inspect
from inference.models import MODALITIES, CatalogModel, Deployment, ModelRevision
from inference.services import (
    catalog_model_create,
    catalog_model_set_revision,
    catalog_model_update,
    deployment_create,
    deployment_update,
    model_name_check,
    revision_create,
)


def _inspection_options(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--context-length", type=int, default=None, help="Serve a shorter context than the model's."
    )
    parser.add_argument(
        "--dtype", default=None, help="auto (default), bfloat16, float16 or float32."
    )
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="Split the model across this many GPUs of one machine (default 1).",
    )


def _media(value: str) -> list[str]:
    media = [m.strip() for m in value.split(",") if m.strip()]
    unknown = set(media) - (set(MODALITIES) - {"text"})
    if unknown:
        raise CommandError(f"--batch-media takes image and/or audio; got {', '.join(media)}")
    return media


class Command(BaseCommand):
    help = "Inspect a local model directory and put it in the catalog or a private deployment."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")
        actions = parser.add_subparsers(dest="action", required=True)

        inspect = actions.add_parser("inspect", help="What DIR would be as a revision.")
        inspect.add_argument("directory")
        _inspection_options(inspect)

        add = actions.add_parser("add", help="A new catalog model or private deployment.")
        add.add_argument("name")
        add.add_argument("--weights", required=True, help="The model's local directory.")
        _inspection_options(add)
        add.add_argument("--label", default=None, help="The revision's name (default: NAME@DIR).")
        add.add_argument("--price-input", type=int, default=None, help="µUSD per 1M tokens.")
        add.add_argument("--price-cached-input", type=int, default=None)
        add.add_argument("--price-output", type=int, default=None)
        add.add_argument("--batch-media", type=_media, default=[], help="image,audio")
        add.add_argument("--deployment", action="store_true", help="A private deployment.")
        add.add_argument("--org", default=None, help="The deployment's organization (id or name).")
        add.add_argument("--gpu-second-price", type=int, default=None, help="µUSD per GPU-second.")
        add.add_argument("--check", action="store_true", help="Generate a few tokens first.")

        actions.add_parser("list", help="Catalog models and deployments.")

        revise = actions.add_parser("set-revision", help="A new revision for NAME.")
        revise.add_argument("name")
        revise.add_argument("--weights", required=True)
        _inspection_options(revise)
        revise.add_argument("--label", default=None)
        revise.add_argument("--check", action="store_true")

        disable = actions.add_parser("disable", help="Stop offering NAME for batch.")
        disable.add_argument("name")

    def handle(self, *args: Any, action: str, json: bool = False, **options: Any) -> None:
        handlers: dict[str, Callable[..., dict[str, Any]]] = {
            "inspect": self._inspect,
            "add": self._add,
            "list": self._list,
            "set-revision": self._set_revision,
            "disable": self._disable,
        }
        handler = handlers[action]
        try:
            result = handler(**options)
        except (InspectionRefused, BoardwalkError, CommandError) as exc:
            message = getattr(exc, "message", None) or str(exc)
            if json:
                self.stdout.write(jsonlib.dumps({"error": {"message": message}}))
            raise CommandError(message) from exc
        if json:
            self.stdout.write(jsonlib.dumps(result, separators=(",", ":")))
        else:
            self.stdout.write(_text(result))

    # -- subcommands --------------------------------------------------------------------

    def _inspect(
        self,
        *,
        directory: str,
        context_length: int | None,
        dtype: str | None,
        tensor_parallel_size: int,
        **_: Any,
    ) -> dict[str, Any]:
        found, refused = _inspected(directory, context_length, dtype, tensor_parallel_size)
        if refused:  # the directory is fine; `add` here would refuse
            found.notes.append(f"not servable on this machine: {refused}")
        return found.as_dict()

    def _add(
        self,
        *,
        name: str,
        weights: str,
        context_length: int | None,
        dtype: str | None,
        label: str | None,
        price_input: int | None,
        price_cached_input: int | None,
        price_output: int | None,
        batch_media: list[str],
        deployment: bool,
        org: str | None,
        gpu_second_price: int | None,
        check: bool,
        tensor_parallel_size: int,
        **_: Any,
    ) -> dict[str, Any]:
        model_name_check(name=name)
        prices = (price_input, price_cached_input, price_output)
        if deployment:
            if org is None or gpu_second_price is None:
                raise CommandError("a deployment needs --org and --gpu-second-price")
            if any(p is not None for p in prices) or batch_media:
                raise CommandError(
                    "a deployment is billed per GPU-second: token prices and --batch-media "
                    "are for catalog models"
                )
        elif None in prices and any(p is not None for p in prices):
            raise CommandError(
                "give all three of --price-input, --price-cached-input and --price-output "
                "(or none: the model is then listed but not offered for batch)"
            )
        inspection = _servable(weights, context_length, dtype, tensor_parallel_size)
        missing = set(batch_media) - set(inspection.modalities)
        if missing:
            raise CommandError(
                f"--batch-media {', '.join(sorted(missing))}: the model cannot publish it "
                f"(it publishes {', '.join(inspection.modalities)})"
            )
        owner = organization_by_id_or_name(org) if deployment and org else None
        revision = _revision(inspection, name=name, label=label, check=check)
        if owner is not None and gpu_second_price is not None:
            created = deployment_create(
                org=owner, name=name, revision=revision, gpu_second_price=gpu_second_price
            )
            return _deployment_row(created) | {"inspection": inspection.as_dict()}
        catalog = catalog_model_create(
            name=name,
            revision=revision,
            prices=None if None in prices else prices,  # type: ignore[arg-type]
            media=batch_media,
        )
        return _catalog_row(catalog) | {"inspection": inspection.as_dict()}

    def _list(self, **_: Any) -> dict[str, Any]:
        return {
            "catalog": [_catalog_row(m) for m in CatalogModel.objects.select_related("revision")],
            "deployments": [
                _deployment_row(d) for d in Deployment.objects.select_related("revision", "org")
            ],
        }

    def _set_revision(
        self,
        *,
        name: str,
        weights: str,
        context_length: int | None,
        dtype: str | None,
        label: str | None,
        check: bool,
        tensor_parallel_size: int,
        **_: Any,
    ) -> dict[str, Any]:
        target = _named(name)
        inspection = _servable(weights, context_length, dtype, tensor_parallel_size)
        revision = _revision(inspection, name=name, label=label, check=check)
        if isinstance(target, CatalogModel):
            catalog_model_set_revision(model=target, revision=revision)
            target.refresh_from_db()
            return _catalog_row(target)
        deployment_update(
            deployment=target, revision=revision, gpu_second_price=target.gpu_second_price
        )
        target.refresh_from_db()
        return _deployment_row(target)

    def _disable(self, *, name: str, **_: Any) -> dict[str, Any]:
        catalog = _named(name)
        if not isinstance(catalog, CatalogModel):
            raise CommandError(
                f"{name!r} is a private deployment: only its organization can use it, and it "
                "has no public batch offer to disable"
            )
        catalog_model_update(model=catalog, prices=None, media=catalog.batch_media)
        catalog.refresh_from_db()
        return _catalog_row(catalog)


def _named(name: str) -> CatalogModel | Deployment:
    """The catalog model or deployment `name` means (names are unique across both)."""
    found = (
        CatalogModel.objects.filter(name=name).select_related("revision").first()
        or Deployment.objects.filter(name=name).select_related("revision", "org").first()
    )
    if found is None:
        raise CommandError(f"no catalog model or deployment is named {name!r} (see `model list`)")
    return found


def _inspected(
    weights: str, context_length: int | None, dtype: str | None, tensor_parallel_size: int
) -> tuple[Inspection, str | None]:
    """The directory's inspection, and what keeps this machine from serving it (or None)."""
    inspection = model_inspect(
        weights,
        context_length=context_length,
        dtype=dtype,
        tensor_parallel_size=tensor_parallel_size,
    )
    return inspection, _machine_refusal(inspection)


def _servable(
    weights: str, context_length: int | None, dtype: str | None, tensor_parallel_size: int
) -> Inspection:
    """The inspection of a directory this machine can serve, else InspectionRefused."""
    inspection, refused = _inspected(weights, context_length, dtype, tensor_parallel_size)
    if refused:
        raise InspectionRefused(refused)
    return inspection


def _machine_refusal(inspection: Inspection) -> str | None:
    """What keeps this machine's workers from serving `inspection` (its GPUs, its kernels);
    only asked when there is something to ask, since counting GPUs imports torch."""
    if inspection.tensor_parallel_size == 1 and inspection.quantization is None:
        return None
    return machine_refusal(inspection, cuda_devices=_cuda_devices())


def _cuda_devices() -> int:
    """The GPUs this machine's workers serve on: none when BOARDWALK_ENGINE_DEVICE is cpu."""
    if settings.ENGINE_DEVICE == "cpu":
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _revision(
    inspection: Inspection, *, name: str, label: str | None, check: bool
) -> ModelRevision:
    """The new revision `inspection` describes (after `--check`, when asked)."""
    fields = inspection.revision_fields(label=label or f"{name}@{inspection.path}")
    if check:
        _check(fields)
    return revision_create(**fields)


def _check(fields: dict[str, Any]) -> None:
    """Generate a few tokens with the revision before it exists (imports torch: only here)."""
    from inference.engine.loading import ModelLoadError
    from inference.runtime import revision_check

    try:
        result = revision_check(ModelRevision(**fields))
    except (ModelLoadError, ValueError, RuntimeError) as exc:
        raise CommandError(f"--check: the model does not run here: {exc}") from exc
    if result.error or not result.choices or not result.choices[0].token_ids:
        raise CommandError(f"--check: the model generated nothing ({result.error or 'no tokens'})")


def _revision_row(revision: ModelRevision) -> dict[str, Any]:
    return {
        "id": revision.id,
        "label": revision.label,
        "weights": revision.weights,
        "context_length": revision.context_length,
        "dtype": revision.dtype,
        "modalities": revision.modalities,
        "tool_call_format": revision.tool_call_format,
        "tensor_parallel_size": revision.tensor_parallel_size,
    }


def _catalog_row(model: CatalogModel) -> dict[str, Any]:
    return {
        "name": model.name,
        "kind": "catalog",
        "batch": model.batch_enabled,
        "prices": {
            "input": model.price_input,
            "cached_input": model.price_cached_input,
            "output": model.price_output,
        }
        if model.batch_enabled
        else None,
        "batch_media": model.batch_media,
        "revision": _revision_row(model.revision),
    }


def _deployment_row(deployment: Deployment) -> dict[str, Any]:
    return {
        "name": deployment.name,
        "kind": "deployment",
        "org": deployment.org.name,
        "gpu_second_price": deployment.gpu_second_price,
        "revision": _revision_row(deployment.revision),
    }


def _text(result: dict[str, Any]) -> str:
    if "catalog" in result and "deployments" in result:
        lines = [f"{'NAME':<28} {'KIND':<10} {'BATCH':<6} {'REVISION':<30} PRICES"]
        for row in result["catalog"] + result["deployments"]:
            if row["kind"] == "catalog":
                batch = "on" if row["batch"] else "off"
                prices = row["prices"]
                price = (
                    f"{prices['input']}/{prices['cached_input']}/{prices['output']} µUSD/1M"
                    if prices
                    else "-"
                )
            else:
                batch, price = "org", f"{row['gpu_second_price']} µUSD/GPU-s ({row['org']})"
            lines.append(
                f"{row['name']:<28} {row['kind']:<10} {batch:<6} {row['revision']['id']:<30} "
                f"{price}"
            )
        return "\n".join(lines)
    return "\n".join(f"{key}: {value}" for key, value in result.items())
