"""Worker liveness: one row per worker process, stamped every few seconds.

Item leases stay long (a slow step or a busy database must not make them fragile), yet a
`kill -9`'d worker's items come back within seconds: every live process stamps its row each
BOARDWALK_WORKER_HEARTBEAT_SECONDS, and whichever process notices a row older than
BOARDWALK_WORKER_DEAD_AFTER_SECONDS frees that process's leases (`lease_owner` starts with
the process id) and deletes the row (`batches.queue.recover.dead_workers_recover`). A
process that was only paused comes back to find its leases re-issued under new tokens: the
fence refuses its results.

On PostgreSQL a process also holds a session advisory lock keyed by its id on its liveness
connection. A `kill -9` ends that session, so the lock comes free at once, and another process
recovers the leases as soon as the row is a little more than two beats old (2.5 s by default)
instead of after the whole silence (8 s). A live process whose session was cut (a killed
backend, a restarted database) re-connects and takes its lock again within two beats, before
that grace runs out, so it is not mistaken for dead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections import deque

from django.conf import settings
from django.db import connection

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
    # Another thread may be importing it right now (partially initialized: no function yet).
    runtime = sys.modules.get("inference.runtime")
    loaded = getattr(runtime, "loaded_revision_ids", None)
    return sorted(loaded()) if loaded is not None else []


def lock_key(process: str) -> int:
    """The advisory lock key of a process id (signed 64 bits, as PostgreSQL takes them)."""
    digest = hashlib.blake2b(process.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


_locked = threading.local()


def session_lock_hold(*, process: str) -> bool:
    """PostgreSQL: hold this process's advisory lock on this thread's connection (taken once
    per connection; a new connection takes it again). False elsewhere, or while a peer's
    check holds it for a moment."""
    if not settings.IS_POSTGRES:
        return False
    connection.ensure_connection()
    raw = connection.connection
    if getattr(_locked, "raw", None) is raw:
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [lock_key(process)])
        held = bool(cursor.fetchone()[0])
    _locked.raw = raw if held else None
    return held


def worker_beat(*, process: str, session_lock: bool = False) -> None:
    """Stamp the process's row. `session_lock`: whether it holds its advisory lock (taken
    before the row says so, so that no peer reads a lock-holding row without the lock)."""
    now = clock.now()
    recorded, rate = _throughput()
    stats = {
        "revisions": _loaded_revisions(),
        "device": settings.ENGINE_DEVICE or "auto",
        "items_recorded": recorded,
        "items_per_second": round(rate, 3),
        "session_lock": session_lock,
    }
    if not WorkerProcess.objects.filter(id=process).update(seen_at=now, **stats):
        WorkerProcess.objects.get_or_create(id=process, defaults={"seen_at": now, **stats})


def worker_leave(*, process: str) -> None:
    """A clean stop: the row goes, the process's leases were handed back already."""
    WorkerProcess.objects.filter(id=process).delete()
