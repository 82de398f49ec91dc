"""Retention (docs/API.md "Limits, retention and privacy"): unused input after 24 h, accepted input
once its batch is terminal (48 h after acceptance at the latest), results 7 days after the batch
ended.

Expiry is crypto-shredding: the data key is destroyed, then every stored copy of the blob.
Each step is a compare-and-set or an idempotent delete, so any number of sweepers may run at
once and repeat themselves; each counts only what it did itself.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import asdict, dataclass

from django.db.models import Q, QuerySet

from batches.models import Batch, BatchItem
from boardwalk import clock
from files.models import File
from files.services import file_delete_leftover_blobs, file_shred
from files.storage import content_store

logger = logging.getLogger(__name__)

STAGING_GRACE_SECONDS = 6 * 3600  # far longer than any upload takes
# Batches expire 24 h after acceptance and then end within minutes; this bound holds even for one
# that did not (docs/API.md "Limits, retention and privacy": accepted input is gone 48 h after
# acceptance at the latest).
ACCEPTED_INPUT_TTL = dt.timedelta(hours=48)


@dataclass
class RetentionReport:
    """What one retention pass did, per kind (counts only: ids and content stay out)."""

    unused_input: int = 0  # input files never used by a batch, 24 h after upload
    accepted_input: int = 0  # input of a terminal batch, or 48 h after acceptance
    expired_results: int = 0  # output and error files, 7 days after the batch ended
    item_results: int = 0  # sealed per-item results of terminal batches (copies of output)
    leftover_blobs: int = 0  # blobs of shredded files whose deletion had failed
    staged_blobs: int = 0  # blobs a crashed upload left staged, never named

    @property
    def files_shredded(self) -> int:
        return self.unused_input + self.accepted_input + self.expired_results

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _live_files() -> QuerySet[File]:
    return File.objects.filter(status=File.Status.PROCESSED)


def unused_input_due() -> QuerySet[File]:
    return _live_files().filter(
        purpose=File.Purpose.BATCH, batch__isnull=True, expires_at__lte=clock.now()
    )


def accepted_input_due() -> QuerySet[File]:
    terminal = Q(batch__status__in=Batch.TERMINAL)
    overdue = Q(batch__created_at__lte=clock.now() - ACCEPTED_INPUT_TTL)
    return _live_files().filter(Q(purpose=File.Purpose.BATCH) & (terminal | overdue))


def expired_results_due() -> QuerySet[File]:
    return _live_files().filter(purpose=File.Purpose.BATCH_OUTPUT, expires_at__lte=clock.now())


def _shred_all(files: QuerySet[File]) -> int:
    return sum(file_shred(file=file) for file in list(files))


def item_results_drop(*, batch_id: str | None = None) -> int:
    """Clear the sealed per-item results of terminal batches; returns how many items.

    Once a batch is terminal its results live in the output file (and its recovery copy);
    the per-item rows would be one more copy that deleting the file leaves behind.
    """
    items = BatchItem.objects.filter(batch__status__in=Batch.TERMINAL, result__isnull=False)
    if batch_id is not None:
        items = items.filter(batch_id=batch_id)
    return items.update(result=None)


def retention_sweep() -> RetentionReport:
    report = RetentionReport(
        unused_input=_shred_all(unused_input_due()),
        accepted_input=_shred_all(accepted_input_due()),
        expired_results=_shred_all(expired_results_due()),
        item_results=item_results_drop(),
        leftover_blobs=file_delete_leftover_blobs(),
        # Encrypted, keyless and never named, but they take space until removed.
        staged_blobs=content_store().discard_abandoned(
            clock.now().timestamp() - STAGING_GRACE_SECONDS
        ),
    )
    if any(report.as_dict().values()):
        logger.info("retention %s", " ".join(f"{kind}={n}" for kind, n in report.as_dict().items()))
    return report
