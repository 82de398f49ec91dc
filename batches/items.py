"""Durable work items: claim with a lease, heartbeat, complete under a fencing token.

Any number of workers on any number of machines cooperate through these functions alone
(DESIGN decisions 1 and 2). On PostgreSQL a claim skips rows other workers hold
(FOR UPDATE SKIP LOCKED); on SQLite the IMMEDIATE transaction makes each claim the only
writer, which is the correct single-writer path for the embedded default.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q

from batches.models import Batch, BatchItem
from boardwalk import clock
from boardwalk.faultpoints import fault_point

logger = logging.getLogger(__name__)

OPEN_STATES = (BatchItem.State.PENDING, BatchItem.State.RUNNING)


@dataclass(frozen=True)
class EngineKey:
    """Which engine serves an item: its revision, and for private batches its deployment."""

    revision_id: str
    deployment_id: str = ""


def _lease_until() -> dt.datetime:
    return clock.now() + dt.timedelta(seconds=settings.ITEM_LEASE_SECONDS)


def items_claim(*, key: EngineKey, worker_id: str, limit: int) -> list[BatchItem]:
    """Lease up to `limit` pending items, earliest deadline first.

    Each claim increments the item's lease_token: the fencing token its result must carry.
    """
    now = clock.now()
    with transaction.atomic():
        candidates = (
            BatchItem.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(
                revision_id_key=key.revision_id,
                deployment_id_key=key.deployment_id,
                state=BatchItem.State.PENDING,
                deadline__gt=now,
                batch__status=Batch.Status.IN_PROGRESS,
                batch__outcome="",
            )
            .order_by("deadline", "batch_id", "index")
            .values_list("id", flat=True)[:limit]
        )
        ids = list(candidates)
        if not ids:
            return []
        fault_point("items_claim.locked")  # test only: the candidates are row-locked here
        BatchItem.objects.filter(id__in=ids, state=BatchItem.State.PENDING).update(
            state=BatchItem.State.RUNNING,
            lease_owner=worker_id,
            lease_expires_at=_lease_until(),
            lease_token=F("lease_token") + 1,
            attempts=F("attempts") + 1,
            started_at=now,
        )
        return list(
            BatchItem.objects.filter(
                id__in=ids, lease_owner=worker_id, state=BatchItem.State.RUNNING
            )
            .select_related("batch", "batch__input_file")
            .order_by("deadline", "batch_id", "index")
        )


def items_heartbeat(*, worker_id: str, item_ids: list[int]) -> int:
    """Extend the leases this worker still holds; returns how many it still holds."""
    if not item_ids:
        return 0
    return BatchItem.objects.filter(
        id__in=item_ids, lease_owner=worker_id, state=BatchItem.State.RUNNING
    ).update(lease_expires_at=_lease_until())


def item_finish(
    *,
    item: BatchItem,
    worker_id: str,
    succeeded: bool,
    result: bytes | None,
    error_code: str = "",
    prompt_tokens: int = 0,
    cached_tokens: int = 0,
    completion_tokens: int = 0,
    gpu_seconds: float = 0.0,
) -> bool:
    """Record an item's result; False if the lease was lost (another worker owns it now).

    The compare-and-set on (state, owner, token) is the fence: a worker that paused past
    its lease, or whose batch was cancelled meanwhile, cannot overwrite or double-publish.
    """
    state = BatchItem.State.SUCCEEDED if succeeded else BatchItem.State.FAILED
    with transaction.atomic():
        updated = BatchItem.objects.filter(
            id=item.id,
            state=BatchItem.State.RUNNING,
            lease_owner=worker_id,
            lease_token=item.lease_token,
        ).update(
            state=state,
            result=result,
            error_code=error_code,
            usage_prompt_tokens=prompt_tokens,
            usage_cached_tokens=cached_tokens,
            usage_completion_tokens=completion_tokens,
            gpu_seconds=F("gpu_seconds") + gpu_seconds,
            lease_owner="",
            lease_expires_at=None,
            completed_at=clock.now(),
        )
        if not updated:
            return False
        counter = "completed" if succeeded else "failed"
        Batch.objects.filter(id=item.batch_id).update(**{counter: F(counter) + 1})
        fault_point("item_finish.in_transaction")  # test only: holding the item's row lock
    return True


def item_release(*, item: BatchItem, worker_id: str, gpu_seconds: float = 0.0) -> None:
    """Give an unfinished item back (aborted or worker stopping); its GPU time still counts."""
    BatchItem.objects.filter(
        id=item.id,
        state=BatchItem.State.RUNNING,
        lease_owner=worker_id,
        lease_token=item.lease_token,
    ).update(
        state=BatchItem.State.PENDING,
        lease_owner="",
        lease_expires_at=None,
        gpu_seconds=F("gpu_seconds") + gpu_seconds,
    )


def batch_has_open_items(*, batch_id: str) -> bool:
    return BatchItem.objects.filter(batch_id=batch_id, state__in=OPEN_STATES).exists()


def batch_live_leases(*, batch_id: str) -> int:
    return BatchItem.objects.filter(
        batch_id=batch_id, state=BatchItem.State.RUNNING, lease_expires_at__gt=clock.now()
    ).count()


def batch_revoke_leases(*, batch_id: str) -> int:
    """Fence off every running item of a batch that is stopping (cancel, expiry, failure)."""
    return BatchItem.objects.filter(batch_id=batch_id, state=BatchItem.State.RUNNING).update(
        state=BatchItem.State.PENDING,
        lease_owner="",
        lease_expires_at=None,
        lease_token=F("lease_token") + 1,
    )


def leases_recover() -> tuple[int, int]:
    """Return abandoned items (lease expired) to the queue; fail those out of attempts.

    Returns (requeued, failed). A crashed worker's items are retried by whoever claims next.
    """
    now = clock.now()
    expired = Q(state=BatchItem.State.RUNNING, lease_expires_at__lte=now)
    failed_ids = list(
        BatchItem.objects.filter(expired, attempts__gte=settings.ITEM_MAX_ATTEMPTS).values_list(
            "id", flat=True
        )
    )
    failed = 0
    for item in BatchItem.objects.filter(id__in=failed_ids):
        with transaction.atomic():
            done = BatchItem.objects.filter(
                id=item.id, state=BatchItem.State.RUNNING, lease_token=item.lease_token
            ).update(
                state=BatchItem.State.FAILED,
                error_code="internal_error",
                lease_owner="",
                lease_expires_at=None,
                lease_token=F("lease_token") + 1,
                completed_at=now,
            )
            if done:
                Batch.objects.filter(id=item.batch_id).update(failed=F("failed") + 1)
                failed += done
    requeued = BatchItem.objects.filter(expired).update(
        state=BatchItem.State.PENDING,
        lease_owner="",
        lease_expires_at=None,
        lease_token=F("lease_token") + 1,
    )
    if requeued or failed:
        logger.warning("lease recovery requeued=%s failed=%s", requeued, failed)
    return requeued, failed


def keys_with_claimable_items() -> set[EngineKey]:
    rows = (
        BatchItem.objects.filter(
            state=BatchItem.State.PENDING,
            batch__status=Batch.Status.IN_PROGRESS,
            batch__outcome="",
            deadline__gt=clock.now(),
        )
        .values_list("revision_id_key", "deployment_id_key")
        .distinct()
    )
    return {EngineKey(rev, dep) for rev, dep in rows}
