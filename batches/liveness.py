"""Worker liveness: one row per worker process, stamped every few seconds.

Item leases stay long (a slow step or a busy database must not make them fragile), yet a
`kill -9`'d worker's items come back within seconds: every live process stamps its row each
BOARDWALK_WORKER_HEARTBEAT_SECONDS, and whichever process notices a row older than
BOARDWALK_WORKER_DEAD_AFTER_SECONDS frees that process's leases (`lease_owner` starts with
the process id) and deletes the row. A process that was only paused comes back to find its
leases re-issued under new tokens: the fence refuses its results.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections import deque

from django.conf import settings
from django.db import transaction

from batches.items import EngineKey, keys_with_claimable_items, leases_recover
from batches.models import WorkerProcess
from boardwalk import clock

logger = logging.getLogger(__name__)

_process: tuple[int, str] | None = None


def process_id() -> str:
    """This process's id: host, pid and a random part (a reused pid is another process)."""
    global _process
    if _process is None or _process[0] != os.getpid():
        _process = (os.getpid(), f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}")
    return _process[1]


def worker_id() -> str:
    """The lease owner of items claimed by this thread: the process id, then the thread."""
    return f"{process_id()}:{threading.get_ident()}"


RATE_WINDOW_SECONDS = 60.0
_recorded_lock = threading.Lock()
_recorded = 0
_samples: deque[tuple[float, int]] = deque()


def items_recorded_add(count: int) -> None:
    """The record stage wrote `count` results in this process (the workers view's rate)."""
    global _recorded
    with _recorded_lock:
        _recorded += count


def _throughput() -> tuple[int, float]:
    """(results written by this process, results per second over the last minute)."""
    now = time.monotonic()
    with _recorded_lock:
        total = _recorded
        _samples.append((now, total))
        while len(_samples) > 1 and now - _samples[0][0] > RATE_WINDOW_SECONDS:
            _samples.popleft()
        first_at, first = _samples[0]
    elapsed = now - first_at
    return total, (total - first) / elapsed if elapsed > 0 else 0.0


def _loaded_revisions() -> list[str]:
    # Read without importing: a process that never imported the runtime has no engine, and
    # importing it here would pull transformers into every process that beats.
    runtime = sys.modules.get("inference.runtime")
    return sorted(runtime.loaded_revision_ids()) if runtime is not None else []


def worker_beat(*, process: str) -> None:
    now = clock.now()
    recorded, rate = _throughput()
    stats = {
        "revisions": _loaded_revisions(),
        "items_recorded": recorded,
        "items_per_second": round(rate, 3),
    }
    if not WorkerProcess.objects.filter(id=process).update(seen_at=now, **stats):
        WorkerProcess.objects.get_or_create(id=process, defaults={"seen_at": now, **stats})


def worker_leave(*, process: str) -> None:
    """A clean stop: the row goes, the process's leases were handed back already."""
    WorkerProcess.objects.filter(id=process).delete()


def dead_workers_recover() -> set[EngineKey]:
    """Free the leases of worker processes that fell silent; returns engine keys to wake.

    The dead rows are locked (SKIP LOCKED) while their leases are freed, so when several
    processes notice the same death only one of them does the work.
    """
    cutoff = clock.now() - dt.timedelta(seconds=settings.WORKER_DEAD_AFTER_SECONDS)
    with transaction.atomic():
        dead = list(
            WorkerProcess.objects.select_for_update(skip_locked=True)
            .filter(seen_at__lt=cutoff)
            .values_list("id", flat=True)
        )
        if not dead:
            return set()
        requeued, failed = leases_recover(dead_processes=dead, expired=False)
        WorkerProcess.objects.filter(id__in=dead).delete()
    logger.warning(
        "worker(s) silent for %ss: %s; requeued=%s failed=%s",
        settings.WORKER_DEAD_AFTER_SECONDS,
        len(dead),
        requeued,
        failed,
    )
    return keys_with_claimable_items() if requeued else set()
