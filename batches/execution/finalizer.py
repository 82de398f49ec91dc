"""Finalizing the batches a run finished, in the worker that finished them.

The record stage learns that a batch has no open item the moment it commits the batch's last
result. Sending a `finalize` message for it cost a trip through the broker: on Redis, an idle
consumer polls its queue only every BOARDWALK_WORKER_POLL_MS, so every batch waited ~50 to 100 ms
(more under load) between its last result and its output file. `Finalizer` publishes it right
away instead, on a thread of its own (the record stage goes on writing other batches' results
meanwhile), and hands a batch to the broker only when it cannot finish it here: one that is
not ready yet (`NotReady`: the actor retries it later) or whose finalization raised (the
actor's bounded retries). A worker killed mid-way loses nothing: finalization is idempotent,
and the sweeper re-drives every batch that is done but not terminal.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable

from django.db import DatabaseError, connection

from batches.lifecycle import NotReady, batch_finalize
from boardwalk.logs import exception_trace

logger = logging.getLogger(__name__)


class Finalizer:
    """Finalizes the batch ids it is given, in order, on one thread; `close` drains it."""

    def __init__(self, *, not_ready: Callable[[str], None], failed: Callable[[str], None]) -> None:
        """`not_ready(batch_id)`: the batch still has live leases (try again later);
        `failed(batch_id)`: its finalization raised here (try again elsewhere)."""
        self._not_ready = not_ready
        self._failed = failed
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()  # None: stop
        self._seen: set[str] = set()
        self._lock = threading.Lock()  # submit is called from the record and prepare threads
        self._thread = threading.Thread(target=self._run, name="finalizer", daemon=True)
        self._thread.start()

    def submit(self, batch_id: str) -> None:
        """Finalize `batch_id` soon (once per Finalizer, however often it is submitted)."""
        with self._lock:
            if batch_id in self._seen:
                return
            self._seen.add(batch_id)
        self._queue.put(batch_id)

    def close(self) -> None:
        """Wait until every submitted batch was finalized or handed on."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        try:
            # Connect now, while the run generates, not after the batch's last result (a new
            # PostgreSQL connection must be set up before the first statement can run).
            with contextlib.suppress(DatabaseError):
                connection.ensure_connection()
            while (batch_id := self._queue.get()) is not None:
                self._finalize(batch_id)
        finally:
            connection.close()  # this thread's own connection

    def _finalize(self, batch_id: str) -> None:
        try:
            batch_finalize(batch_id=batch_id)
        except NotReady:
            self._hand_on(self._not_ready, batch_id)
        except Exception as exc:
            logger.warning(
                "finalizing %s in the worker failed, left to the finalize actor: %s",
                batch_id,
                exception_trace(exc),
            )
            connection.close()  # it may be the connection that broke
            self._hand_on(self._failed, batch_id)

    @staticmethod
    def _hand_on(send: Callable[[str], None], batch_id: str) -> None:
        try:
            send(batch_id)
        except Exception as exc:  # the broker is down: the sweeper finalizes it
            logger.error("finalize of %s not enqueued: %s", batch_id, exception_trace(exc))
