"""Taking leases back: expired ones, those of worker processes that died, and those of
batches that stop.

A crashed worker's items are retried by whoever claims next. Leases stay long (a slow step
or a busy database must not make them fragile), so a `kill -9`'d worker's items come back
through its liveness row instead (batches.liveness): whichever process sees that row silent,
or (PostgreSQL) its session lock free, frees the dead process's leases (`lease_owner` starts
with the process id). A process that was only paused comes back to find its leases re-issued
under new tokens: the fence refuses its results.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q, QuerySet

from batches.liveness import lock_key
from batches.models import BatchItem, WorkerProcess
from batches.queue.queries import EngineKey, keys_with_claimable_items
from boardwalk import clock
from boardwalk.codes import ItemCode

logger = logging.getLogger(__name__)


def leases_recover(*, dead_processes: Iterable[str] = (), expired: bool = True) -> tuple[int, int]:
    """Return abandoned items to the queue; fail those out of attempts.

    Abandoned: the lease expired (unless `expired=False`), or the lease belongs to a worker
    process that stopped stamping its liveness row (`dead_processes`). Returns (requeued,
    failed).
    """
    now = clock.now()
    abandoned = Q(lease_expires_at__lte=now) if expired else Q(pk__in=[])
    for process in dead_processes:
        abandoned |= Q(lease_owner__startswith=f"{process}:")
    running = BatchItem.objects.running().filter(abandoned)
    failed = running.filter(attempts__gte=settings.ITEM_MAX_ATTEMPTS).update(
        state=BatchItem.State.FAILED,
        error_code=ItemCode.INTERNAL_ERROR,
        lease_owner="",
        lease_expires_at=None,
        lease_token=F("lease_token") + 1,
        completed_at=now,
    )
    requeued = running.update(
        state=BatchItem.State.PENDING,
        lease_owner="",
        lease_expires_at=None,
        lease_token=F("lease_token") + 1,
    )
    if requeued or failed:
        logger.warning("lease recovery requeued=%s failed=%s", requeued, failed)
    return requeued, failed


def dead_workers_recover(*, me: str | None = None) -> set[EngineKey]:
    """Free the leases of worker processes that died; returns engine keys to wake.

    Dead: silent for WORKER_DEAD_AFTER_SECONDS, or (PostgreSQL) a row that says it holds its
    session lock while the lock is free — the process's session ended. `me` is the caller's
    own process, never judged (its own lock is re-entrant for its session). The dead rows are
    locked (SKIP LOCKED) while their leases are freed, so when several processes notice the
    same death only one of them does the work.
    """
    cutoff = clock.now() - dt.timedelta(seconds=settings.WORKER_DEAD_AFTER_SECONDS)
    with transaction.atomic():
        rows = WorkerProcess.objects.select_for_update(skip_locked=True)
        dead = list(rows.filter(seen_at__lt=cutoff).values_list("id", flat=True))
        if settings.IS_POSTGRES:
            # A live process whose session was cut (a restarted database, a killed backend)
            # takes its lock again within two beats; judge only rows older than that.
            grace = clock.now() - dt.timedelta(seconds=2.5 * settings.WORKER_HEARTBEAT_SECONDS)
            dead += _sessions_ended(
                rows.filter(session_lock=True, seen_at__gte=cutoff, seen_at__lt=grace).exclude(
                    id=me
                )
            )
        if not dead:
            return set()
        requeued, failed = leases_recover(dead_processes=dead, expired=False)
        WorkerProcess.objects.filter(id__in=dead).delete()
    logger.warning(
        "worker(s) dead (silent for %ss or session ended): %s; requeued=%s failed=%s",
        settings.WORKER_DEAD_AFTER_SECONDS,
        len(dead),
        requeued,
        failed,
    )
    return keys_with_claimable_items() if requeued else set()


def batch_revoke_leases(*, batch_id: str) -> int:
    """Fence off every running item of a batch that is stopping (cancel, expiry, failure)."""
    return (
        BatchItem.objects.running()
        .filter(batch_id=batch_id)
        .update(
            state=BatchItem.State.PENDING,
            lease_owner="",
            lease_expires_at=None,
            lease_token=F("lease_token") + 1,
        )
    )


def _sessions_ended(rows: QuerySet[WorkerProcess]) -> list[str]:
    """The processes among `rows` whose advisory lock is free: their session is gone. The
    probe takes each free lock for this transaction only (released at commit)."""
    ids = list(rows.values_list("id", flat=True))
    if not ids:
        return []
    keys = {lock_key(i): i for i in ids}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT k FROM unnest(%s::bigint[]) AS k WHERE pg_try_advisory_xact_lock(k)",
            [list(keys)],
        )
        return [keys[k] for (k,) in cursor.fetchall()]
