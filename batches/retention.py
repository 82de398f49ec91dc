"""Retention (SPEC §9): unused input after 24 h, accepted input once its batch is terminal
(48 h after acceptance at the latest), results 7 days after the batch ended.

Expiry is crypto-shredding: the data key is destroyed, then the blob is deleted.
"""

from __future__ import annotations

import logging

from django.db.models import Q

from batches.models import Batch
from boardwalk import clock
from files.models import File
from files.services import file_shred
from files.storage import content_store

logger = logging.getLogger(__name__)


def files_due_for_shredding() -> list[File]:
    now = clock.now()
    live = File.objects.filter(status=File.Status.PROCESSED)
    expired_results = Q(purpose=File.Purpose.BATCH_OUTPUT, expires_at__lte=now)
    unused_input = Q(purpose=File.Purpose.BATCH, batch__isnull=True, expires_at__lte=now)
    # The 48 h bound is met by batches themselves (they expire 24 h after acceptance) and
    # this clause removes their input once they end.
    consumed_input = Q(purpose=File.Purpose.BATCH, batch__status__in=Batch.TERMINAL)
    return list(live.filter(expired_results | unused_input | consumed_input))


STAGING_GRACE_SECONDS = 6 * 3600  # far longer than any upload takes


def retention_sweep() -> int:
    files = files_due_for_shredding()
    for file in files:
        file_shred(file=file)
    # Blobs a crashed upload left staged: encrypted, keyless and never named, but they take
    # space until removed.
    content_store().discard_abandoned(STAGING_GRACE_SECONDS)
    if files:
        logger.info("retention shredded %s file(s)", len(files))
    return len(files)
