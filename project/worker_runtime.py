"""Running workers: in-process for the embedded default, `manage.py run_worker` in production.

Both run a Dramatiq worker on the configured broker plus a sweeper thread that calls the
`sweep` actor's function every BOARDWALK_SWEEP_INTERVAL_SECONDS, so the database re-drives
any work whose message was lost, a liveness thread, and a listener on the interactive bells
of the models the process holds loaded (batches.interactive.bells), so a chat request to one
of them is served at once while the process runs nothing else.
"""

from __future__ import annotations

import logging
import threading
import time

import dramatiq
from django.conf import settings
from django.db import connection

from batches.interactive.bells import Bells
from batches.liveness import process_id, session_lock_hold, worker_beat, worker_leave
from batches.queue import dead_workers_recover
from batches.tasks import engine_wake, join_waiting_work, sweep
from boardwalk.broker import setup_broker
from boardwalk.logs import exception_trace
from files.tasks import file_count_tokens

logger = logging.getLogger(__name__)

QUEUES = {"engine", "batches", "webhooks"}
# Prompt token counts after uploads (files.tasks): minutes of CPU for a large file, so they
# get a thread of their own and never take the one that serves the engine.
COUNT_QUEUES = {file_count_tokens.queue_name}


class Sweeper(threading.Thread):
    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True, name="boardwalk-sweeper")
        self.interval = interval
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                sweep()
            except Exception as exc:  # not logger.exception: a message may quote a row's values
                logger.error("sweep failed; retrying next interval: %s", exception_trace(exc))
            finally:
                connection.close()

    def stop(self) -> None:
        self.stopped.set()


class Liveness(threading.Thread):
    """Stamps this process's liveness row and frees the leases of processes that fell silent.

    Survives database errors: one failed beat logs the error's type and retries next interval.
    """

    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True, name="boardwalk-liveness")
        self.interval = interval
        self.process = process_id()
        self.stopped = threading.Event()

    def run(self) -> None:
        last_beat = time.monotonic()
        try:
            while True:
                try:
                    locked = session_lock_hold(process=self.process)
                    worker_beat(process=self.process, session_lock=locked)
                    # A process that was itself stalled (CPU starved, paused) sees every
                    # other row as old: it judges nobody until it has beaten on time again.
                    on_time = time.monotonic() - last_beat <= 2 * self.interval
                    last_beat = time.monotonic()
                    for key in dead_workers_recover(me=self.process) if on_time else ():
                        engine_wake.send(key.revision_id, key.deployment_id)
                    join_waiting_work()
                except Exception as exc:
                    logger.warning("liveness beat failed; retrying: %s", exception_trace(exc))
                    connection.close()
                    self._beat_again()
                if self.stopped.wait(self.interval):
                    break
            worker_leave(process=self.process)
        except Exception as exc:
            logger.warning("liveness row not removed: %s", exception_trace(exc))
        finally:
            connection.close()

    def _beat_again(self) -> None:
        """Right after a failed beat, on a fresh connection: a session that was cut retakes
        its lock now rather than a beat later (peers wait 2.5 beats before judging it)."""
        try:
            locked = session_lock_hold(process=self.process)
            worker_beat(process=self.process, session_lock=locked)
        except Exception as exc:
            logger.warning("liveness beat failed again: %s", exception_trace(exc))
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
            worker_timeout=settings.WORKER_POLL_MS,
        )
        # Take one message per thread at a time: a wake-up buffered by a worker busy serving
        # would wait there while another worker sits idle (scale-out relies on it).
        self.worker.queue_prefetch = self.worker.worker_threads
        self.counter = dramatiq.Worker(
            self.broker,
            queues=COUNT_QUEUES,
            worker_threads=1,
            worker_timeout=settings.WORKER_POLL_MS,
        )
        self.counter.queue_prefetch = 1
        self.sweeper = Sweeper(sweep_interval or settings.SWEEP_INTERVAL_SECONDS)
        self.liveness = Liveness(settings.WORKER_HEARTBEAT_SECONDS)
        self.bells = Bells()

    def start(self) -> WorkerRuntime:
        self.worker.start()
        self.counter.start()
        self.sweeper.start()
        self.liveness.start()
        self.bells.start()
        logger.info(
            "worker started queues=%s threads=%s (+1 for %s)",
            sorted(QUEUES),
            self.worker.worker_threads,
            sorted(COUNT_QUEUES),
        )
        return self

    def stop(self, timeout_ms: int = 10_000) -> None:
        self.sweeper.stop()
        self.bells.stop()
        self.worker.stop(timeout=timeout_ms)
        self.counter.stop(timeout=timeout_ms)
        self.liveness.stop()
        self.liveness.join(timeout=5)
        self.bells.join(timeout=timeout_ms / 1000)  # a run it serves ends with its linger
        # A stopped worker leaves its middleware on the broker; drop it so that a later
        # runtime in the same process (tests) does not stack a second one.
        self.broker.middleware[:] = [
            m for m in self.broker.middleware if type(m).__name__ != "_WorkerMiddleware"
        ]
