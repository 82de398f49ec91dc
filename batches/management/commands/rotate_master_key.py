"""Re-wrap every data key (files and batches) under the first master key of MASTER_KEYS.

Rotation: put the new key first in BOARDWALK_MASTER_KEYS, keep the old ones after it, restart
the processes, run this, and remove an old key once no row uses it any longer (the command
prints the key ids still in use). Content is never read or rewritten. Safe to rerun and to
run while the service is up.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Count

from batches.models import Batch
from files.crypto import Keyring
from files.models import File
from files.services import data_keys_rewrap


class Command(BaseCommand):
    help = (
        "Re-wrap the data keys of files and batches under the current (first) master key of "
        "BOARDWALK_MASTER_KEYS, without touching content; prints counts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be re-wrapped; change nothing."
        )
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")

    def handle(self, *args: Any, **options: Any) -> None:
        keyring = Keyring.current()
        dry_run = options["dry_run"]
        result: dict[str, Any] = {"current_key_id": keyring.current_id, "dry_run": dry_run}
        for label, model in (("files", File), ("batches", Batch)):
            counts = data_keys_rewrap(rows=model.objects.all(), keyring=keyring, dry_run=dry_run)
            in_use = (
                model.objects.filter(wrapped_key__isnull=False)
                .values("key_id")
                .annotate(n=Count("pk"))
                .order_by("key_id")
            )
            result[label] = {
                **counts.as_dict(),
                "key_ids_in_use": {row["key_id"]: row["n"] for row in in_use},
            }
        if options["json"]:
            self.stdout.write(json.dumps(result, sort_keys=True))
        else:
            self.stdout.write(
                f"current master key: {keyring.current_id}" + (" (dry run)" if dry_run else "")
            )
            for label in ("files", "batches"):
                counts = result[label]
                keys = ", ".join(f"{k}={n}" for k, n in counts["key_ids_in_use"].items())
                self.stdout.write(
                    f"{label}: rewrapped={counts['rewrapped']} current={counts['current']} "
                    f"unknown_key={counts['unknown_key']} damaged={counts['damaged']} "
                    f"key_ids_in_use: {keys or 'none'}"
                )
        stuck = sum(
            result[label][k] for label in ("files", "batches") for k in ("unknown_key", "damaged")
        )
        if stuck:
            raise CommandError(
                f"{stuck} data key(s) could not be re-wrapped (their master key is not "
                "configured, or they failed authentication); keep the old master keys."
            )
