"""Watching a batch until it is terminal, with a progress line on stderr."""

from __future__ import annotations

import sys
import time
from typing import Any

from boardwalk_cli.client import Client

TERMINAL = ("completed", "failed", "cancelled", "expired")


def _progress(batch: dict[str, Any], *, tty: bool) -> None:
    counts = batch.get("request_counts") or {}
    total = counts.get("total") or 0
    done = (counts.get("completed") or 0) + (counts.get("failed") or 0)
    width = 30
    filled = int(width * done / total) if total else 0
    line = (
        f"{batch['id']} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
        f"({counts.get('completed', 0)} ok, {counts.get('failed', 0)} failed) {batch['status']}"
    )
    sys.stderr.write(("\r" + line) if tty else (line + "\n"))
    sys.stderr.flush()


def wait(client: Client, batch: dict[str, Any], *, interval: float, quiet: bool) -> dict[str, Any]:
    tty = sys.stderr.isatty()
    delay = interval
    while batch["status"] not in TERMINAL:
        if not quiet:
            _progress(batch, tty=tty)
        time.sleep(delay)
        delay = min(delay * 1.5, max(interval, 30.0))
        batch = client.json("GET", f"/batches/{batch['id']}")
    if not quiet:
        _progress(batch, tty=tty)
        if tty:
            sys.stderr.write("\n")
    return batch
