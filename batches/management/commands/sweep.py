"""One housekeeping pass: lease recovery, batch expiry, stuck finalization (see batches.sweeps)."""

from django.core.management.base import BaseCommand

from batches.lifecycle import NotReady, batch_finalize
from batches.sweeps import sweep_work


class Command(BaseCommand):
    help = (
        "Recover expired leases, expire overdue batches, finish stuck finalizations and "
        "shred files past retention."
    )

    def handle(self, *args, **options):
        report = sweep_work()
        finalized = 0
        for batch_id in report.to_finalize:
            try:
                if batch_finalize(batch_id=batch_id) is not None:
                    finalized += 1
            except NotReady:
                pass
        self.stdout.write(
            f"requeued={report.requeued} failed={report.failed} expired={len(report.expired)} "
            f"finalized={finalized} shredded={report.shredded} "
            f"engine_keys_with_work={len(report.to_wake)}"
        )
