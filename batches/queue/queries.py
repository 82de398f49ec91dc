"""What the queue holds: open items per batch, claimable work per engine key, live leases.

The tasks, the pipeline, the sweeps and the lifecycle ask these questions; each is one
indexed query.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from batches.models import BatchItem
from boardwalk import clock


@dataclass(frozen=True)
class EngineKey:
    """Which engine serves an item: its revision, and for private batches its deployment."""

    revision_id: str
    deployment_id: str = ""


def key_has_claimable_items(key: EngineKey) -> bool:
    """One indexed existence query: whether a wake-up for `key` has anything to claim."""
    return (
        BatchItem.objects.claimable(clock.now())
        .filter(revision_id_key=key.revision_id, deployment_id_key=key.deployment_id)
        .exists()
    )


def keys_with_claimable_items() -> set[EngineKey]:
    rows = (
        BatchItem.objects.claimable(clock.now())
        .values_list("revision_id_key", "deployment_id_key")
        .distinct()
    )
    return {EngineKey(rev, dep) for rev, dep in rows}


def batch_has_open_items(*, batch_id: str) -> bool:
    return BatchItem.objects.open().filter(batch_id=batch_id).exists()


def batches_without_open_items(*, batch_ids: Iterable[str]) -> set[str]:
    """Which of these batches have no pending or running item left (one query)."""
    wanted = set(batch_ids)
    if not wanted:
        return set()
    open_ = set(
        BatchItem.objects.open()
        .filter(batch_id__in=wanted)
        .values_list("batch_id", flat=True)
        .distinct()
    )
    return wanted - open_


def batch_live_leases(*, batch_id: str) -> int:
    return (
        BatchItem.objects.running()
        .filter(batch_id=batch_id, lease_expires_at__gt=clock.now())
        .count()
    )
