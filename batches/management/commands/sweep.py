"""One housekeeping pass: lease recovery, batch expiry, stuck finalization and retention.

Safe to run from cron, by hand and beside the worker's own periodic sweep, any number of
times and concurrently: every step is a compare-and-set or an idempotent delete, and each
process counts only what it did itself (see batches.sweeps and batches.retention).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from batches.lifecycle import NotReady, batch_finalize
from batches.sweeps import FINALIZE, SWEEP_KINDS, sweep_work


class Command(BaseCommand):
    help = (
        "Recover expired leases (and the holds of interactive requests no worker settled), "
        "expire overdue batches, finish stuck finalizations and "
        "shred files past retention; prints what it did, per kind."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--only",
            action="append",
            choices=SWEEP_KINDS,
            help="Run only this part of the sweep (repeatable). Default: all of them.",
        )
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")

    def handle(self, *args: Any, **options: Any) -> None:
        only = tuple(options["only"] or SWEEP_KINDS)
        report = sweep_work(only=only)
        counts: dict[str, dict[str, int]] = {}
        if "leases" in only:
            counts["leases"] = {
                "requeued": report.requeued,
                "failed": report.failed,
                "holds_released": report.holds_released,
            }
        if "expiry" in only:
            counts["expiry"] = {"expired": len(report.expired)}
        if FINALIZE in only:
            finalized = waiting = 0
            for batch_id in report.to_finalize:
                try:
                    if batch_finalize(batch_id=batch_id) is not None:
                        finalized += 1
                except NotReady:
                    waiting += 1
            counts["finalize"] = {"finalized": finalized, "waiting": waiting}
        if "retention" in only:
            counts["retention"] = report.retention.as_dict()
        if "leases" in only or "expiry" in only:
            counts["wake"] = {"engine_keys_with_work": len(report.to_wake)}
        if options["json"]:
            self.stdout.write(json.dumps(counts, sort_keys=True))
            return
        for kind, values in counts.items():
            self.stdout.write(f"{kind}: " + " ".join(f"{k}={v}" for k, v in values.items()))
