"""Credit holds that no worker settled: the sweeper gives them back.

An interactive request's hold (`hold:req_…`, the entry's `request_id`) is released where it
ran (batches.interactive.settle) or by the web tier, which voids every request it answers with
an error (service.interactive_void). A worker and a web process that both died mid-request do
neither, and the hold would keep the credit from the organization for good. Once the
request's reply deadline has passed (its wait for a worker, its run, and a margin), nothing
can settle it any more on its own: the sweep appends its release, an entry like any other,
never a delete. The ledger's keys make it once only,
and a request settled meanwhile (its `release:` entry written) is left alone.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.db.models import Exists, OuterRef

from batches.interactive.config import setting
from billing.models import LedgerEntry
from billing.services import credit_settle
from boardwalk import clock

logger = logging.getLogger(__name__)

MARGIN_SECONDS = 60  # past the reply deadline, so a settle on its way lands first
BATCH_SIZE = 500  # holds released per sweep at most (the next sweep takes the rest)


def orphan_cutoff() -> dt.datetime:
    """Holds taken before this belong to requests that can no longer finish."""
    lifetime = setting("INTERACTIVE_QUEUE_SECONDS") + setting("INTERACTIVE_TIMEOUT_SECONDS")
    return clock.now() - dt.timedelta(seconds=lifetime + MARGIN_SECONDS)


def orphaned_holds_release() -> int:
    """Release the holds of interactive requests that no one settled by their deadline;
    returns how many it found (one settled in the meantime keeps its own release)."""
    released = LedgerEntry.objects.filter(
        request_id=OuterRef("request_id"), kind=LedgerEntry.Kind.RELEASE
    )
    orphans = (
        LedgerEntry.objects.filter(kind=LedgerEntry.Kind.HOLD, created_at__lt=orphan_cutoff())
        .exclude(request_id="")  # interactive requests' holds; batches' name a batch_id
        .exclude(Exists(released))
        .order_by("created_at")
        .values_list("org_id", "request_id")[:BATCH_SIZE]
    )
    count = 0
    for org_id, request_id in list(orphans):
        # Nothing ran to bill: the release alone (revision only names a charge's spend).
        credit_settle(
            org_id=org_id,
            request_id=request_id,
            charge_microusd=0,
            revision_id="",
            usage_class="interactive",
        )
        count += 1
    if count:
        logger.warning("released %d interactive holds that no worker settled", count)
    return count
