"""Reads of the catalog and deployments, always scoped to the calling organization."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings

from boardwalk.codes import ErrorCode, LineCode
from boardwalk.errors import NotFound
from boardwalk.models import Organization
from inference.models import CatalogModel, Deployment, ModelRevision
from inference.tokenization import runnable_media_for


@dataclass(frozen=True)
class ResolvedModel:
    """What a request's `body.model` names, for one organization
    (docs/API.md "Models and deployments")."""

    name: str
    kind: str  # "catalog" | "deployment"
    revision: ModelRevision
    catalog: CatalogModel | None = None
    deployment: Deployment | None = None

    @property
    def batch_enabled(self) -> bool:
        """Whether a new batch may target it (a disabled model takes none)."""
        if self.deployment is not None:
            return self.deployment.enabled
        return bool(self.catalog and self.catalog.enabled and self.catalog.batch_enabled)

    @property
    def interactive_prices(self) -> tuple[int, int, int] | None:
        """A catalog model's interactive prices; None when it is not offered interactively,
        or for a deployment (billed per GPU-second)."""
        return None if self.catalog is None else self.catalog.interactive_prices

    @property
    def batch_media(self) -> frozenset[str]:
        """Modalities beyond text that a batch on this target may carry."""
        if self.deployment is not None:
            media = self.revision.modalities
        elif self.catalog is not None and self.batch_enabled:
            media = [m for m in self.catalog.batch_media if m in self.revision.modalities]
        else:
            media = []
        # What the revision publishes, and only what the engine can run for it (a revision
        # saved through the admin is not checked at creation).
        return frozenset(media) & runnable_media_for(self.revision)


class ModelNotUsable(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _disabled(name: str) -> ModelNotUsable:
    return ModelNotUsable(
        LineCode.MODEL_DISABLED,
        f"Model {name!r} is disabled: it takes no new batches or requests until an operator "
        f"enables it again (`manage.py model enable {name}`).",
    )


def model_resolve(*, org: Organization, name: str, interactive: bool = False) -> ResolvedModel:
    """Resolve `name` for `org`, for a batch or (`interactive`) for `POST /v1/chat/completions`;
    raises ModelNotUsable with a code the upload or the request reports. A disabled model
    takes neither; a catalog model takes batch with batch prices, interactive requests with
    interactive prices."""
    deployment = Deployment.objects.select_related("revision").filter(name=name).first()
    catalog = CatalogModel.objects.select_related("revision").filter(name=name).first()
    if deployment is not None and deployment.org_id != org.id:
        deployment = None  # another org's deployment is simply unknown
    if deployment is not None and catalog is not None:
        raise ModelNotUsable(
            LineCode.MODEL_AMBIGUOUS,
            f"Model {name!r} names both a catalog model and a deployment; ask staff to rename one.",
        )
    if deployment is not None:
        if not deployment.enabled:
            raise _disabled(name)
        return ResolvedModel(name, "deployment", deployment.revision, deployment=deployment)
    if catalog is None:
        raise ModelNotUsable(
            LineCode.MODEL_NOT_FOUND,
            f"Model {name!r} is neither a catalog model nor one of your deployments.",
        )
    if not catalog.enabled:
        raise _disabled(name)
    resolved = ResolvedModel(name, "catalog", catalog.revision, catalog=catalog)
    if interactive:
        if resolved.interactive_prices is None:
            raise ModelNotUsable(
                ErrorCode.MODEL_NOT_INTERACTIVE,
                f"Catalog model {name!r} is not offered for interactive requests: it has no "
                "interactive prices (an operator sets them with `manage.py model set-price "
                f"{name} --interactive-input … --interactive-cached-input … "
                "--interactive-output …`).",
            )
    elif not resolved.batch_enabled:
        raise ModelNotUsable(
            LineCode.MODEL_NOT_BATCH_ENABLED, f"Catalog model {name!r} is not available for batch."
        )
    return resolved


def models_for_org(*, org: Organization) -> list[ResolvedModel]:
    entries = [
        ResolvedModel(c.name, "catalog", c.revision, catalog=c)
        for c in CatalogModel.objects.select_related("revision")
    ]
    entries += [
        ResolvedModel(d.name, "deployment", d.revision, deployment=d)
        for d in Deployment.objects.select_related("revision").filter(org=org)
    ]
    return sorted(entries, key=lambda e: e.name)


def model_get_for_org(*, org: Organization, name: str) -> ResolvedModel:
    for entry in models_for_org(org=org):
        if entry.name == name:
            return entry
    raise NotFound(f"No model named {name!r}.", param="model")


def too_wide_for_this_worker(revision: ModelRevision) -> str | None:
    """Why this worker process leaves the revision's work to others, or None: a
    tensor-parallel revision over more GPUs than the worker owns (`WORKER_GPUS`; its ranks
    would take GPUs another worker's engine runs on)."""
    owned = settings.WORKER_GPUS
    if owned <= 0 or revision.tensor_parallel_size <= owned:
        return None
    return (
        f"revision {revision.id} runs tensor-parallel over {revision.tensor_parallel_size} "
        f"GPUs and this worker owns {owned} (BOARDWALK_WORKER_GPUS; `run_worker --devices` "
        "gives each worker the GPUs up to the next one): its work is left to a worker that "
        f"owns {revision.tensor_parallel_size}, such as `run_worker --device cuda:K` or "
        "`--devices` listing one device per group"
    )


def revisions_too_wide_for_this_worker(revision_ids: Iterable[str]) -> set[str]:
    """Which of these revisions this worker process leaves to others (one query, none when
    the worker owns every GPU it sees)."""
    owned = settings.WORKER_GPUS
    if owned <= 0:
        return set()
    return set(
        ModelRevision.objects.filter(
            id__in=list(revision_ids), tensor_parallel_size__gt=owned
        ).values_list("id", flat=True)
    )
