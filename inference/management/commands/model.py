"""Serve your own models:
`manage.py model inspect|add|list|set-revision|set-price|disable|enable`.

A revision is either a local directory Boardwalk's engine loads (`--weights DIR`) or an
external engine that answers its rows (`--engine-url URL --engine-model ID --tokenizer DIR`:
an OpenAI-compatible server such as vLLM or SGLang, inference/external/); for the latter
`inspect` and `add --check` ask the server (`inference.external.check`).

Every subcommand takes `--json` (before or after the subcommand: one JSON object on stdout,
the result or `{"error": …}`), exits 1 with a message that says what to change on any
refusal, and writes through `inference.services`, so the catalog's rules hold as they do in
the admin.
"""

from __future__ import annotations

import json as jsonlib
from argparse import SUPPRESS, ArgumentParser
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from boardwalk.errors import BoardwalkError
from boardwalk.selectors import organization_by_id_or_name
from inference.external.check import CheckRefused, upstream_check
from inference.external.upstream import Upstream, UpstreamConfigError, api_key_from_environment
from inference.inspection import (
    Inspection,
    InspectionRefused,
    external_inspect,
    machine_refusal,
    model_inspect,
)
from inference.models import MODALITIES, CatalogModel, Deployment, ModelRevision
from inference.services import (
    Prices,
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

_PRICE_FLAGS = ("--price-input", "--price-cached-input", "--price-output")
_INTERACTIVE_FLAGS = ("--interactive-input", "--interactive-cached-input", "--interactive-output")


def _price_options(parser: ArgumentParser) -> None:
    for flag in _PRICE_FLAGS:
        parser.add_argument(flag, type=int, default=None, help="Batch: µUSD per 1M tokens.")
    for flag in _INTERACTIVE_FLAGS:
        parser.add_argument(
            flag,
            type=int,
            default=None,
            help="Interactive requests (POST /v1/chat/completions): µUSD per 1M tokens, at "
            "least the batch price (flex pays the batch prices).",
        )


def _three(options: dict[str, Any], flags: tuple[str, ...], absent: str) -> Prices | None:
    """The three prices `flags` give, None when none is given; some but not all: refused."""
    values = tuple(options.get(flag.removeprefix("--").replace("-", "_")) for flag in flags)
    if all(v is None for v in values):
        return None
    if None in values:
        raise CommandError(f"give all three of {', '.join(flags)} (or none: {absent})")
    return values  # type: ignore[return-value]


def _json_option(parser: ArgumentParser) -> None:
    # SUPPRESS: a subcommand without --json keeps the value given before it.
    parser.add_argument("--json", action="store_true", default=SUPPRESS, help="One JSON object.")


def _inspection_options(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--context-length", type=int, default=None, help="Serve a shorter context than the model's."
    )
    parser.add_argument(
        "--dtype", default=None, help="auto (default), bfloat16, float16 or float32."
    )
    parser.add_argument(
        "--dialect",
        default=None,
        help="How the model writes reasoning and tool calls (default: found in its chat "
        'template; docs/API.md "Model dialects").',
    )
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="Split the model across this many GPUs of one machine (default 1).",
    )


def _engine_options(parser: ArgumentParser, *, inspecting: bool = False) -> None:
    """An external engine's options; `inspect` takes the tokenizer directory as DIR."""
    parser.add_argument(
        "--engine-url",
        default=None,
        help="An OpenAI-compatible server that answers the rows (vLLM, SGLang, TGI), with "
        "/v1: http://vllm-head:8000/v1.",
    )
    parser.add_argument("--engine-model", default=None, help="The model id the server lists.")
    if not inspecting:
        parser.add_argument(
            "--tokenizer",
            default=None,
            help="With --engine-url: the model's tokenizer directory (config.json, tokenizer, "
            "chat template; no weights).",
        )
    parser.add_argument(
        "--engine-api-key-env",
        default="",
        help="The environment variable that holds the server's API key (never stored).",
    )
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help="With --engine-url: the most rows in flight at once across all workers "
        "(default 32; see docs/DEPLOYMENT.md).",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="With --engine-url: the GPUs the server holds for this model (a private "
        "deployment's is charged for them).",
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

        inspect = actions.add_parser(
            "inspect",
            help="What DIR would be as a revision (with --engine-url: DIR is the tokenizer "
            "directory, and the server is asked).",
        )
        inspect.add_argument("directory")
        _inspection_options(inspect)
        _engine_options(inspect, inspecting=True)

        add = actions.add_parser("add", help="A new catalog model or private deployment.")
        add.add_argument("name")
        add.add_argument("--weights", default=None, help="The model's local directory.")
        _inspection_options(add)
        _engine_options(add)
        add.add_argument("--label", default=None, help="The revision's name (default: NAME@DIR).")
        _price_options(add)
        add.add_argument("--batch-media", type=_media, default=[], help="image,audio")
        add.add_argument("--deployment", action="store_true", help="A private deployment.")
        add.add_argument("--org", default=None, help="The deployment's organization (id or name).")
        add.add_argument("--gpu-second-price", type=int, default=None, help="µUSD per GPU-second.")
        add.add_argument(
            "--check",
            action="store_true",
            help="Generate a few tokens first (with --engine-url: the server lists the model "
            "and answers a one-token request).",
        )

        actions.add_parser("list", help="Catalog models and deployments.")

        revise = actions.add_parser("set-revision", help="A new revision for NAME.")
        revise.add_argument("name")
        revise.add_argument("--weights", default=None)
        _inspection_options(revise)
        _engine_options(revise)
        revise.add_argument("--label", default=None)
        revise.add_argument("--check", action="store_true")

        price = actions.add_parser(
            "set-price", help="New batch and/or interactive prices for catalog model NAME."
        )
        price.add_argument("name")
        _price_options(price)
        price.add_argument("--no-batch", action="store_true", help="Take NAME off batch.")
        price.add_argument(
            "--no-interactive", action="store_true", help="Stop offering NAME interactively."
        )

        disable = actions.add_parser(
            "disable", help="NAME takes no new batches or interactive requests."
        )
        disable.add_argument("name")
        enable = actions.add_parser("enable", help="Undo `disable NAME`.")
        enable.add_argument("name")
        for subparser in actions.choices.values():
            _json_option(subparser)

    def handle(self, *args: Any, action: str, json: bool = False, **options: Any) -> None:
        handlers: dict[str, Callable[..., dict[str, Any]]] = {
            "inspect": self._inspect,
            "add": self._add,
            "list": self._list,
            "set-revision": self._set_revision,
            "set-price": self._set_price,
            "disable": self._disable,
            "enable": self._enable,
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
        dialect: str | None,
        **options: Any,
    ) -> dict[str, Any]:
        external = options.get("engine_url") is not None
        if external:
            options["tokenizer"] = directory
        engine = _engine(
            options, weights=None if external else directory, dtype=dtype, tp=tensor_parallel_size
        )
        if engine is not None:
            found, checked = _external(engine, context_length, dialect, prefix="inspect")
            return found.as_dict() | checked
        found, refused = _inspected(directory, context_length, dtype, tensor_parallel_size, dialect)
        if refused:  # the directory is fine; `add` here would refuse
            found.notes.append(f"not servable on this machine: {refused}")
        return found.as_dict()

    def _add(
        self,
        *,
        name: str,
        weights: str | None,
        context_length: int | None,
        dtype: str | None,
        label: str | None,
        batch_media: list[str],
        deployment: bool,
        org: str | None,
        gpu_second_price: int | None,
        check: bool,
        tensor_parallel_size: int,
        dialect: str | None,
        **options: Any,
    ) -> dict[str, Any]:
        model_name_check(name=name)
        prices = _three(options, _PRICE_FLAGS, "the model is then not offered for batch")
        interactive = _three(
            options, _INTERACTIVE_FLAGS, "the model is then not offered interactively"
        )
        engine = _engine(options, weights=weights, dtype=dtype, tp=tensor_parallel_size)
        if deployment:
            if org is None or gpu_second_price is None:
                raise CommandError("a deployment needs --org and --gpu-second-price")
            if engine is not None and not engine["gpus"]:
                raise CommandError(
                    "a deployment on an external engine is charged its GPUs for the time its "
                    "requests are in flight: give --gpus N (the GPUs the server holds for it)"
                )
            if prices or interactive or batch_media:
                raise CommandError(
                    "a deployment is billed per GPU-second: token prices and --batch-media "
                    "are for catalog models"
                )
        else:
            # Before the revision is made (and --check runs): a refusal creates nothing.
            catalog_prices_check(prices=prices, interactive_prices=interactive)
        inspection, checked = _inspection_of(
            engine, options, weights, context_length, dtype, tensor_parallel_size, dialect, check
        )
        missing = set(batch_media) - set(inspection.modalities)
        if missing:
            raise CommandError(
                f"--batch-media {', '.join(sorted(missing))}: the model cannot publish it "
                f"(it publishes {', '.join(inspection.modalities)})"
            )
        owner = organization_by_id_or_name(org) if deployment and org else None
        revision, checked = _made_revision(
            inspection, checked, external=engine is not None, name=name, label=label, check=check
        )
        if owner is not None and gpu_second_price is not None:
            created = deployment_create(
                org=owner, name=name, revision=revision, gpu_second_price=gpu_second_price
            )
            return _deployment_row(created) | {"inspection": inspection.as_dict()} | checked
        catalog = catalog_model_create(
            name=name,
            revision=revision,
            prices=prices,
            media=batch_media,
            interactive_prices=interactive,
        )
        return _catalog_row(catalog) | {"inspection": inspection.as_dict()} | checked

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
        weights: str | None,
        context_length: int | None,
        dtype: str | None,
        label: str | None,
        check: bool,
        tensor_parallel_size: int,
        dialect: str | None,
        **options: Any,
    ) -> dict[str, Any]:
        target = _named(name)
        engine = _engine(options, weights=weights, dtype=dtype, tp=tensor_parallel_size)
        inspection, checked = _inspection_of(
            engine, options, weights, context_length, dtype, tensor_parallel_size, dialect, check
        )
        revision, checked = _made_revision(
            inspection, checked, external=engine is not None, name=name, label=label, check=check
        )
        if isinstance(target, CatalogModel):
            catalog_model_set_revision(model=target, revision=revision)
            target.refresh_from_db()
            return _catalog_row(target) | checked
        deployment_update(
            deployment=target, revision=revision, gpu_second_price=target.gpu_second_price
        )
        target.refresh_from_db()
        return _deployment_row(target) | checked

    def _set_price(
        self, *, name: str, no_batch: bool, no_interactive: bool, **options: Any
    ) -> dict[str, Any]:
        catalog = _named(name)
        if not isinstance(catalog, CatalogModel):
            raise CommandError(
                f"{name!r} is a private deployment, billed per GPU-second: change its price "
                "in the admin"
            )
        prices = _three(options, _PRICE_FLAGS, "the batch prices are kept")
        interactive = _three(options, _INTERACTIVE_FLAGS, "the interactive prices are kept")
        if (no_batch and prices) or (no_interactive and interactive):
            raise CommandError("--no-batch and --no-interactive take no prices of their kind")
        if not (prices or interactive or no_batch or no_interactive):
            raise CommandError(
                f"nothing to set: give {', '.join(_PRICE_FLAGS)} and/or "
                f"{', '.join(_INTERACTIVE_FLAGS)}, or --no-batch / --no-interactive"
            )
        kept = (catalog.price_input, catalog.price_cached_input, catalog.price_output)
        catalog_model_update(
            model=catalog,
            prices=None if no_batch else prices or (kept if catalog.batch_enabled else None),
            media=catalog.batch_media,
            interactive_prices=None
            if no_interactive
            else interactive or catalog.interactive_prices,
        )
        catalog.refresh_from_db()
        return _catalog_row(catalog)

    def _disable(self, *, name: str, **_: Any) -> dict[str, Any]:
        return self._set_enabled(name, enabled=False)

    def _enable(self, *, name: str, **_: Any) -> dict[str, Any]:
        return self._set_enabled(name, enabled=True)

    def _set_enabled(self, name: str, *, enabled: bool) -> dict[str, Any]:
        target = _named(name)
        model_set_enabled(target=target, enabled=enabled)
        target.refresh_from_db()
        return _row(target)


def _row(target: CatalogModel | Deployment) -> dict[str, Any]:
    return _catalog_row(target) if isinstance(target, CatalogModel) else _deployment_row(target)


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
    weights: str,
    context_length: int | None,
    dtype: str | None,
    tensor_parallel_size: int,
    dialect: str | None,
) -> tuple[Inspection, str | None]:
    """The directory's inspection, and what keeps this machine from serving it (or None)."""
    inspection = model_inspect(
        weights,
        context_length=context_length,
        dtype=dtype,
        tensor_parallel_size=tensor_parallel_size,
        dialect=dialect,
    )
    return inspection, _machine_refusal(inspection)


def _servable(
    weights: str,
    context_length: int | None,
    dtype: str | None,
    tensor_parallel_size: int,
    dialect: str | None,
) -> Inspection:
    """The inspection of a directory this machine can serve, else InspectionRefused."""
    inspection, refused = _inspected(weights, context_length, dtype, tensor_parallel_size, dialect)
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


_ENGINE_FLAGS = ("engine_model", "tokenizer", "max_in_flight", "gpus")


def _local_only(options: dict[str, Any], *, weights: str | None) -> str:
    """The weights of a local revision; refused without them, or with an external engine's
    flags."""
    given = [f"--{k.replace('_', '-')}" for k in _ENGINE_FLAGS if options.get(k) is not None]
    if options.get("engine_api_key_env"):
        given.append("--engine-api-key-env")
    if given:
        raise CommandError(f"{', '.join(given)}: only with --engine-url (an external engine)")
    if weights is None:
        raise CommandError(
            "give --weights DIR (Boardwalk's engine loads it) or --engine-url URL "
            "--engine-model ID --tokenizer DIR (an external engine answers its rows)"
        )
    return weights


def _engine(
    options: dict[str, Any], *, weights: str | None, dtype: str | None, tp: int
) -> dict[str, Any] | None:
    """The external engine the flags describe, None for a local revision (whose flags are
    then checked); refused where they mix the two or leave one out."""
    url = options.get("engine_url")
    if url is None:
        _local_only(options, weights=weights)
        return None
    if weights is not None:
        raise CommandError(
            "--weights and --engine-url exclude each other: an external engine's revision "
            "names its tokenizer directory with --tokenizer"
        )
    missing = [f for f in ("engine_model", "tokenizer") if not options.get(f)]
    if missing:
        raise CommandError(
            f"--engine-url needs {' and '.join('--' + f.replace('_', '-') for f in missing)}"
        )
    if dtype is not None or tp != 1:
        raise CommandError(
            "--dtype and --tensor-parallel-size are Boardwalk's engine's: the external engine "
            "chooses its own"
        )
    max_in_flight, gpus = options.get("max_in_flight"), options.get("gpus")
    return {
        "path": options["tokenizer"],
        "engine_url": url,
        "engine_model": options["engine_model"],
        "engine_api_key_env": options.get("engine_api_key_env") or "",
        "max_in_flight": 32 if max_in_flight is None else max_in_flight,
        "gpus": 0 if gpus is None else gpus,
    }


def _external_inspection(
    engine: dict[str, Any],
    context_length: int | None,
    dialect: str | None,
    served_context_length: int | None = None,
) -> Inspection:
    return external_inspect(
        engine["path"],
        engine_url=engine["engine_url"],
        engine_model=engine["engine_model"],
        engine_api_key_env=engine["engine_api_key_env"],
        max_in_flight=engine["max_in_flight"],
        gpus=engine["gpus"],
        context_length=context_length,
        dialect=dialect,
        served_context_length=served_context_length,
    )


def _external(
    engine: dict[str, Any], context_length: int | None, dialect: str | None, *, prefix: str
) -> tuple[Inspection, dict[str, Any]]:
    """The inspection of an external engine's revision after its server was asked (the
    model is listed, one token is answered; the context is capped at what it serves), and
    what the check found. Refused, naming the reason, when the server cannot serve it."""
    inspection = _external_inspection(engine, context_length, dialect)  # offline checks first
    described = inspection.engine or {}
    variable = described["api_key_env"]
    try:
        upstream = Upstream(
            url=described["url"],
            model=described["model"],
            api_key=api_key_from_environment(variable),
        )
        found = upstream_check(upstream, key_variable=variable)
    except (UpstreamConfigError, CheckRefused) as exc:
        raise CommandError(f"{prefix}: {exc}") from exc
    if found.context_length is not None:
        inspection = _external_inspection(
            engine, context_length, dialect, served_context_length=found.context_length
        )
    return inspection, {"check": {"ok": True} | found.as_dict()}


def _inspection_of(
    engine: dict[str, Any] | None,
    options: dict[str, Any],
    weights: str | None,
    context_length: int | None,
    dtype: str | None,
    tensor_parallel_size: int,
    dialect: str | None,
    check: bool,
) -> tuple[Inspection, dict[str, Any]]:
    """What `add` and `set-revision` would make, refused before anything is: an external
    engine's (its server asked with `--check`: what it found), else a local directory's
    (`--check` runs once the revision is made, `_made_revision`)."""
    if engine is not None:
        if check:
            return _external(engine, context_length, dialect, prefix="--check")
        return _external_inspection(engine, context_length, dialect), {}
    local = _local_only(options, weights=weights)
    return _servable(local, context_length, dtype, tensor_parallel_size, dialect), {}


def _made_revision(
    inspection: Inspection,
    checked: dict[str, Any],
    *,
    external: bool,
    name: str,
    label: str | None,
    check: bool,
) -> tuple[ModelRevision, dict[str, Any]]:
    """The revision `_inspection_of` described, and what its check found."""
    if external:
        return _external_revision(inspection, name=name, label=label), checked
    return _revision(inspection, name=name, label=label, check=check)


def _external_revision(inspection: Inspection, *, name: str, label: str | None) -> ModelRevision:
    return revision_create(**inspection.revision_fields(label=label or f"{name}@{inspection.path}"))


def _revision(
    inspection: Inspection, *, name: str, label: str | None, check: bool
) -> tuple[ModelRevision, dict[str, Any]]:
    """The new revision `inspection` describes, made after `--check` passed when asked, and
    what the check found ({} without `--check`)."""
    fields = inspection.revision_fields(label=label or f"{name}@{inspection.path}")
    checked = {"check": _check(fields)} if check else {}
    return revision_create(**fields), checked


def _check(fields: dict[str, Any]) -> dict[str, Any]:
    """Generate a few tokens with the revision before it exists (imports torch: only here)."""
    from inference.runtime import revision_check

    try:
        result = revision_check(ModelRevision(**fields))
    except Exception as exc:  # whatever stops it, the answer is "it does not run here"
        raise CommandError(
            f"--check: the model does not run here: {exc} ({type(exc).__name__})"
        ) from exc
    if result.error or not result.choices or not result.choices[0].token_ids:
        raise CommandError(f"--check: the model generated nothing ({result.error or 'no tokens'})")
    return {
        "ok": True,
        "prompt_tokens": result.prompt_tokens,
        "generated_tokens": len(result.choices[0].token_ids),
    }


def _revision_row(revision: ModelRevision) -> dict[str, Any]:
    return {
        "id": revision.id,
        "label": revision.label,
        "weights": revision.weights,
        "context_length": revision.context_length,
        "dtype": revision.dtype,
        "modalities": revision.modalities,
        "dialect": revision.dialect,
        "tensor_parallel_size": revision.tensor_parallel_size,
        "engine": {
            "url": revision.engine_url,
            "model": revision.engine_model,
            "api_key_env": revision.engine_api_key_env,
            "max_in_flight": revision.max_in_flight,
            "gpus": revision.engine_gpus,
        }
        if revision.is_external
        else None,
    }


def _catalog_row(model: CatalogModel) -> dict[str, Any]:
    interactive = model.interactive_prices
    return {
        "name": model.name,
        "kind": "catalog",
        "enabled": model.enabled,
        "batch": model.batch_enabled,
        "prices": _prices_row((model.price_input, model.price_cached_input, model.price_output))
        if model.batch_enabled
        else None,
        "interactive_prices": _prices_row(interactive) if interactive else None,
        "batch_media": model.batch_media,
        "revision": _revision_row(model.revision),
    }


def _prices_row(prices: Prices) -> dict[str, int]:
    return dict(zip(("input", "cached_input", "output"), prices, strict=True))


def _deployment_row(deployment: Deployment) -> dict[str, Any]:
    return {
        "name": deployment.name,
        "kind": "deployment",
        "enabled": deployment.enabled,
        "org": deployment.org.name,
        "gpu_second_price": deployment.gpu_second_price,
        "revision": _revision_row(deployment.revision),
    }


def _text(result: dict[str, Any]) -> str:
    if "catalog" in result and "deployments" in result:
        lines = [
            f"{'NAME':<28} {'KIND':<10} {'STATE':<8} {'BATCH':<6} {'REVISION':<30} "
            "PRICES (µUSD/1M: batch; interactive)"
        ]
        for row in result["catalog"] + result["deployments"]:
            if row["kind"] == "catalog":
                batch = "on" if row["batch"] else "off"
                price = f"{_price_text(row['prices'])}; {_price_text(row['interactive_prices'])}"
            else:
                batch, price = "org", f"{row['gpu_second_price']} µUSD/GPU-s ({row['org']})"
            state = "enabled" if row["enabled"] else "disabled"
            lines.append(
                f"{row['name']:<28} {row['kind']:<10} {state:<8} {batch:<6} "
                f"{row['revision']['id']:<30} {price}"
            )
        return "\n".join(lines)
    return "\n".join(f"{key}: {value}" for key, value in result.items())


def _price_text(prices: dict[str, int] | None) -> str:
    return f"{prices['input']}/{prices['cached_input']}/{prices['output']}" if prices else "-"
