"""Periodic housekeeping: the database, not the broker, is the source of truth for work.

One pass returns expired leases (and the credit holds of interactive requests that no worker
settled, batches.interactive.orphans), expires overdue batches, re-drives finalization that a lost
message or a crash left behind, shreds files past retention, and reports which engine keys
still have claimable items so the caller can wake them. Every step is idempotent; any
number of processes may sweep, and `only` runs a subset (`manage.py sweep --only ...`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from batches.interactive.orphans import orphaned_holds_release
from batches.lifecycle import (
    batch_expire,
    batch_mark_complete_if_done,
    batches_needing_finalization,
)
from batches.models import Batch, BatchItem
from batches.queue import EngineKey, keys_with_claimable_items, leases_recover
from batches.retention import RetentionReport, retention_sweep
from boardwalk.metrics import counter_inc

logger = logging.getLogger(__name__)

# The parts of a sweep, in the order a full one runs them.
LEASES, EXPIRY, FINALIZE, RETENTION = "leases", "expiry", "finalize", "retention"
SWEEP_KINDS = (LEASES, EXPIRY, FINALIZE, RETENTION)


@dataclass
class SweepReport:
    requeued: int = 0
    failed: int = 0
    holds_released: int = 0
    expired: list[str] = field(default_factory=list)
    to_finalize: list[str] = field(default_factory=list)
    to_wake: set[EngineKey] = field(default_factory=set)
    retention: RetentionReport = field(default_factory=RetentionReport)

    @property
    def shredded(self) -> int:
        return self.retention.files_shredded


def sweep_work(*, only: Collection[str] = SWEEP_KINDS) -> SweepReport:
    unknown = set(only) - set(SWEEP_KINDS)
    if unknown:
        raise ValueError(f"unknown sweep kind(s): {', '.join(sorted(unknown))}")
    report = SweepReport()
    if LEASES in only:
        report.requeued, report.failed = leases_recover()
        counter_inc("boardwalk_lease_recoveries_total", {"outcome": "requeued"}, by=report.requeued)
        counter_inc("boardwalk_lease_recoveries_total", {"outcome": "failed"}, by=report.failed)
        report.holds_released = orphaned_holds_release()
    if EXPIRY in only:
        for batch in Batch.objects.overdue():
            if batch_expire(batch=batch):
                report.expired.append(batch.id)
    if FINALIZE in only:
        # Batches whose last item finished while their finalize message was lost.
        idle = (
            Batch.objects.running()
            .exclude(items__state__in=BatchItem.OPEN)
            .values_list("id", flat=True)
        )
        for batch_id in list(idle):
            batch_mark_complete_if_done(batch_id=batch_id)
        report.to_finalize = batches_needing_finalization()
    if LEASES in only or EXPIRY in only:
        report.to_wake = keys_with_claimable_items()
    if RETENTION in only:
        report.retention = retention_sweep()
    return report
