"""Running workers: in-process for the embedded default, `manage.py run_worker` in production.

Both run a Dramatiq worker on the configured broker plus a sweeper thread that calls the
`sweep` actor's function every BOARDWALK_SWEEP_INTERVAL_SECONDS, so the database re-drives
any work whose message was lost.
"""

from __future__ import annotations

import logging
import threading

import dramatiq
from django.conf import settings
from django.db import connection

from batches.tasks import sweep
from boardwalk.broker import setup_broker

logger = logging.getLogger(__name__)

QUEUES = {"engine", "batches", "webhooks"}


class Sweeper(threading.Thread):
    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True, name="boardwalk-sweeper")
        self.interval = interval
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                sweep()
            except Exception:
                logger.exception("sweep failed; retrying next interval")
            finally:
                connection.close()

    def stop(self) -> None:
        self.stopped.set()


class WorkerRuntime:
    def __init__(self, *, threads: int | None = None, sweep_interval: float | None = None) -> None:
        self.broker = setup_broker()
        self.worker = dramatiq.Worker(
            self.broker,
            queues=QUEUES,
            worker_threads=threads or settings.WORKER_THREADS,
            worker_timeout=1000,
        )
        self.sweeper = Sweeper(sweep_interval or settings.SWEEP_INTERVAL_SECONDS)

    def start(self) -> WorkerRuntime:
        self.worker.start()
        self.sweeper.start()
        logger.info(
            "worker started queues=%s threads=%s", sorted(QUEUES), self.worker.worker_threads
        )
        return self

    def stop(self, timeout_ms: int = 10_000) -> None:
        self.sweeper.stop()
        self.worker.stop(timeout=timeout_ms)
        # A stopped worker leaves its middleware on the broker; drop it so that a later
        # runtime in the same process (tests) does not stack a second one.
        self.broker.middleware[:] = [
            m for m in self.broker.middleware if type(m).__name__ != "_WorkerMiddleware"
        ]
