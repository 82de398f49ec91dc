"""Running the stages for one engine key: claim+prepare → generate → record.

Threaded (the worker): prepare runs on its own thread and fills a bounded queue the engine
pulls from; the engine thread only generates; record runs on its own thread and writes results
in groups. Inline (`threaded=False`, tests that run inside one database transaction): the same
stages, called in turn from the caller's thread.

Containment: a request that makes the engine raise is retried alone; if it raises alone it
ends as that item's `internal_error` row and the others carry on. An engine that fails every
request hands the items back (their attempts were counted at claim time, so a poison item
cannot loop: BOARDWALK_ITEM_MAX_ATTEMPTS ends it).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.db import connection

from batches.execution.prepare import Prepare, Unpreparable, Work, request_key
from batches.execution.record import Finished, Record
from batches.items import EngineKey, item_release, items_heartbeat, key_has_claimable_items
from batches.lifecycle import batch_fail
from batches.liveness import worker_id
from batches.models import Batch, BatchItem
from boardwalk import clock
from boardwalk.codes import ErrorCode
from inference.engine.containment import Contained
from inference.engine.loading import ModelLoadError
from inference.engine.process import EngineProcessError
from inference.engine.protocol import GenerationEngine
from inference.engine.types import GenerationRequest, GenerationResult
from inference.media_layout import MediaLayout
from inference.models import ModelRevision
from inference.runtime import engine_drop, engine_for, engine_lock
from inference.tokenization import media_layout_for

logger = logging.getLogger(__name__)

RECORD_WINDOW_SECONDS = 0.1  # a record group gathers results for this long at most
STOPPING_POLL_SECONDS = 1.0
_END = object()
_UNCLAIMED = object()  # to the prepare stage: claim the next group
_FLUSH = object()  # to the record stage: write what you gathered without waiting

_serving: set[EngineKey] = set()
_serving_lock = threading.Lock()


def serving_nothing() -> bool:
    """Whether no thread of this process is running an engine for any key right now."""
    with _serving_lock:
        return not _serving


def serve_key(
    key: EngineKey,
    *,
    budget_seconds: float = 600.0,
    max_items: int | None = None,
    threaded: bool = False,
    on_batch_done: Callable[[str], None] | None = None,
    on_more_work: Callable[[], None] | None = None,
) -> set[str]:
    """Run the engine for `key` until no claimable item is left or the budget is spent.

    Returns the ids of batches that have no open item left (ready to finalize);
    `on_batch_done` is also called with each as soon as it is known. Only one thread per
    process serves a key at a time: a second wake-up returns at once, since the first
    claims new items as it goes. `max_items` stops claiming after that many (tests).
    `on_more_work` is called after every claim that filled a whole group: more work is
    waiting, so the caller can wake another worker. One wake-up per full group, not one per
    run: idle workers poll the broker only so often (BOARDWALK_WORKER_POLL_MS), so a chain
    of single wake-ups (each woken worker waking the next) took a poll per worker to spread
    a large batch, while several pending at once reach every idle worker in one poll. A
    wake-up that finds nothing left to claim costs one existence query.
    """
    with _serving_lock:
        if key in _serving:
            return set()
        _serving.add(key)
    try:
        # Wake-ups outnumber runs (one per full claim group, for other workers): one that
        # finds nothing costs this query, not a model load or a run's threads.
        if not key_has_claimable_items(key):
            return set()
        revision = ModelRevision.objects.filter(id=key.revision_id).first()
        if revision is None:  # a stale message: nothing of this revision can be claimed
            return set()
        try:
            engine = engine_for(revision)
        except (ModelLoadError, EngineProcessError) as exc:
            logger.error("revision %s failed to load: %s", revision.id, type(exc).__name__)
            return _fail_batches_of(key, message=str(exc))
        # Media rows are laid out only for an engine that runs their encoders.
        layout = media_layout_for(revision)
        if layout is not None and layout.modality not in engine.media_modalities:
            layout = None
        run = _Run(key, engine, budget_seconds, max_items, on_batch_done, on_more_work, layout)
        with engine_lock(revision.id):
            if threaded:
                run.threaded()
            else:
                run.inline()
        if run.engine_broken:
            engine_drop(revision.id)
        return run.record.done
    finally:
        with _serving_lock:
            _serving.discard(key)


class _Heartbeat(threading.Thread):
    """Extends the leases of the items this run holds until stopped.

    A database error costs one beat, never the thread: it logs the error's type, drops the
    broken connection and tries again at the next interval.
    """

    def __init__(self, run: _Run) -> None:
        super().__init__(daemon=True, name="lease-heartbeat")
        self.run_ = run
        self.stopped = threading.Event()

    def run(self) -> None:
        interval = max(1.0, settings.ITEM_LEASE_SECONDS / 3)
        try:
            while not self.stopped.wait(interval):
                try:
                    items_heartbeat(worker_id=self.run_.owner, item_ids=self.run_.held_ids())
                except Exception as exc:
                    logger.warning("lease heartbeat failed (%s); retrying", type(exc).__name__)
                    connection.close()
        finally:
            connection.close()


class _Run:
    def __init__(
        self,
        key: EngineKey,
        engine: GenerationEngine,
        budget_seconds: float,
        max_items: int | None,
        on_batch_done: Callable[[str], None] | None,
        on_more_work: Callable[[], None] | None = None,
        media_layout: MediaLayout | None = None,
    ) -> None:
        self.key = key
        self.on_more_work = on_more_work
        self.engine = engine
        self.owner = worker_id()
        self.stop_at = time.monotonic() + budget_seconds
        self.remaining = max_items
        self.prepare = Prepare(
            key=key,
            owner=self.owner,
            tokenizer=engine.tokenizer,
            group_size=settings.EXECUTION_CLAIM_GROUP,
            media_layout=media_layout,
        )
        self.record = Record(owner=self.owner, on_batch_done=on_batch_done)
        self._held: dict[str, BatchItem] = {}  # request id → item, claimed and not recorded
        self._lock = threading.Lock()
        self._stopping: frozenset[str] = frozenset()
        self.engine_broken = False

    # -- shared bookkeeping -----------------------------------------------------------------

    def held_ids(self) -> list[int]:
        with self._lock:
            return [item.id for item in self._held.values()]

    def _holding(self) -> bool:
        with self._lock:
            return bool(self._held)

    def held_batches(self) -> set[str]:
        with self._lock:
            return {item.batch_id for item in self._held.values()}

    def _hold(self, rid: str, item: BatchItem) -> None:
        with self._lock:
            self._held[rid] = item

    def _take(self, rid: str) -> BatchItem | None:
        with self._lock:
            return self._held.pop(rid, None)

    def _claim_more(self) -> bool:
        return time.monotonic() < self.stop_at and (self.remaining is None or self.remaining > 0)

    def _next_group(self, room: int | None = None) -> Iterator[Work | Unpreparable] | None:
        """Claim a group of at most `room` items and return them as they are prepared; None
        when there is nothing more to claim. The claimed items are held (heartbeat, release)
        at once."""
        if not self._claim_more():
            return None
        size = min(n for n in (self.prepare.group_size, room, self.remaining) if n is not None)
        claimed, ended = self.prepare.claim(size)
        if ended:
            self.record.check_batches(ended)
        if not claimed:
            return None
        if self.remaining is not None:
            self.remaining -= len(claimed)
        if self.on_more_work is not None and len(claimed) >= size:
            self.on_more_work()
        for item in claimed:
            self._hold(request_key(item), item)
        return self.prepare.prepared(claimed)

    def _refresh_stopping(self) -> None:
        """Which held requests belong to batches that are stopping (cancel, expiry)."""
        with self._lock:
            held = dict(self._held)
        batch_ids = {item.batch_id for item in held.values()}
        if not batch_ids:
            self._stopping = frozenset()
            return
        stopping = set(
            Batch.objects.filter(id__in=batch_ids)
            .exclude(status=Batch.Status.IN_PROGRESS, outcome="", expires_at__gt=clock.now())
            .values_list("id", flat=True)
        )
        self._stopping = frozenset(rid for rid, item in held.items() if item.batch_id in stopping)

    def _finished(self, result: GenerationResult) -> Finished | None:
        item = self._take(result.id)
        return None if item is None else Finished(item, result)

    def _unpreparable(self, p: Unpreparable) -> Finished:
        self._take(request_key(p.item))
        return Finished(p.item, None, p.error_code)

    def _write(self, group: list[Finished]) -> None:
        self.record.write(group, still_held=self.held_batches())

    # -- the engine loop, with containment --------------------------------------------------

    def _generate(
        self, source: Iterator[GenerationRequest], aborted: Callable[[], frozenset[str]]
    ) -> Iterator[GenerationResult]:
        """The engine's results; a request that makes it raise is isolated (see module doc):
        in the engine process itself (`EngineProcess`), or here around an in-process one."""
        runner: GenerationEngine = (
            self.engine if self.engine.contains_failures else Contained(self.engine)
        )
        try:
            yield from runner.generate(source, aborted=aborted)
        finally:
            if runner.broken:
                # Not one request: the engine itself is broken. Stop; whatever is still
                # held goes back to the queue and its attempts already count.
                self.engine_broken = True

    # -- inline: the caller's thread runs every stage ----------------------------------------

    def inline(self) -> None:
        heartbeat = _Heartbeat(self)
        heartbeat.start()
        try:

            def source() -> Iterator[GenerationRequest]:
                while (group := self._next_group()) is not None:
                    for p in group:
                        if isinstance(p, Work):
                            yield p.request
                        else:
                            self._write([self._unpreparable(p)])

            def aborted() -> frozenset[str]:
                self._refresh_stopping()
                return self._stopping

            for result in self._generate(source(), aborted):
                finished = self._finished(result)
                if finished is not None:
                    self._write([finished])
        finally:
            heartbeat.stopped.set()
            self.prepare.close()
            self._release_held()

    # -- threaded: prepare and record on their own threads -----------------------------------

    def threaded(self) -> None:
        ahead = _Ahead(maxsize=max(2, self.engine.max_batch_size))
        results: queue.Queue[Any] = queue.Queue()
        over = threading.Event()
        heartbeat = _Heartbeat(self)
        # The first group is claimed here, on this thread's open connection: on the prepare
        # thread's new one (PostgreSQL) the engine's first requests waited ~10 ms longer.
        try:
            first: Any = self._next_group(ahead.maxsize)
        except Exception as exc:
            logger.warning("claim failed (%s); the prepare stage retries", type(exc).__name__)
            connection.close()
            first = _UNCLAIMED
        preparer = threading.Thread(
            target=self._prepare_loop,
            args=(ahead, results, over, first),
            name="prepare",
            daemon=True,
        )
        recorder = threading.Thread(
            target=self._record_loop, args=(results,), name="record", daemon=True
        )
        for thread in (heartbeat, preparer, recorder):
            thread.start()

        def source() -> Iterator[GenerationRequest]:
            while (request := ahead.get()) is not _END:
                yield request

        try:
            for result in self._generate(source(), lambda: self._stopping):
                finished = self._finished(result)
                if finished is not None:
                    results.put(finished)
                    if not self._holding():  # nothing else to wait for: write it now
                        results.put(_FLUSH)
        finally:
            over.set()
            while preparer.is_alive():  # unblock a prepare stage waiting for room
                with contextlib.suppress(queue.Empty):
                    while True:
                        ahead.get_nowait()
                preparer.join(timeout=0.01)  # (a blocking get here waited out its timeout)
            with contextlib.suppress(queue.Full):  # and an engine process's feeder
                ahead.put_nowait(_END)
            results.put(_END)
            recorder.join()
            heartbeat.stopped.set()
            self.prepare.close()
            self._release_held()

    def _prepare_loop(
        self, ahead: _Ahead, results: queue.Queue[Any], over: Any, first: Any = None
    ) -> None:
        """`first`: the group `threaded` claimed already (None: nothing was left to claim),
        or `_UNCLAIMED`."""
        ended = False
        # Claim only what the queue can take, once it has room for half a group: an item
        # claimed while the queue is full waits in this worker, not on the engine, and a
        # worker that dies takes its claims with it until its leases are recovered (a queue
        # and a group ahead of a full engine were 48 items to re-run behind the others).
        want = max(1, min(self.prepare.group_size, ahead.maxsize) // 2)
        try:
            last_poll = 0.0
            group = first
            while not over.is_set():
                if group is _UNCLAIMED:
                    room = ahead.room(want, timeout=STOPPING_POLL_SECONDS)
                    if room < want:
                        last_poll = self._poll_stopping(last_poll)
                        continue
                    try:
                        group = self._next_group(room)
                    except Exception as exc:
                        logger.warning("claim failed (%s); retrying", type(exc).__name__)
                        connection.close()
                        if over.wait(1.0):
                            break
                        continue
                if group is None:
                    break
                for p in group:
                    if over.is_set():  # the rest stay held, and are handed back
                        break
                    if isinstance(p, Unpreparable):
                        results.put(self._unpreparable(p))
                        continue
                    while not over.is_set():
                        try:
                            ahead.put(p.request, timeout=STOPPING_POLL_SECONDS)
                            break
                        except queue.Full:
                            last_poll = self._poll_stopping(last_poll)
                group = _UNCLAIMED
                last_poll = self._poll_stopping(last_poll)
            ahead.put(_END)
            ended = True
            while not over.wait(STOPPING_POLL_SECONDS):
                last_poll = self._poll_stopping(last_poll)
        finally:
            if not ended:  # whatever went wrong, the engine must not wait for more
                while not over.is_set():
                    try:
                        ahead.put(_END, timeout=STOPPING_POLL_SECONDS)
                        break
                    except queue.Full:
                        pass
            connection.close()

    def _poll_stopping(self, last: float) -> float:
        now = time.monotonic()
        if now - last < STOPPING_POLL_SECONDS:
            return last
        try:
            self._refresh_stopping()
        except Exception as exc:
            logger.warning("stopping check failed (%s)", type(exc).__name__)
            connection.close()
        return now

    def _record_loop(self, results: queue.Queue[Any]) -> None:
        limit = settings.EXECUTION_RECORD_GROUP
        ending = False
        try:
            while not ending:
                first = results.get()
                if first is _END:
                    break
                if first is _FLUSH:
                    continue
                group = [first]
                until = time.monotonic() + RECORD_WINDOW_SECONDS
                while len(group) < limit:
                    try:
                        more = results.get(timeout=max(0.0, until - time.monotonic()))
                    except queue.Empty:
                        break
                    if more is _END:
                        ending = True
                        break
                    if more is _FLUSH:
                        break
                    group.append(more)
                self._write_retrying(group)
        finally:
            connection.close()

    def _write_retrying(self, group: list[Finished]) -> None:
        for attempt in range(3):
            try:
                self._write(group)
                return
            except Exception as exc:
                logger.warning(
                    "recording %s result(s) failed (%s); attempt %s",
                    len(group),
                    type(exc).__name__,
                    attempt + 1,
                )
                connection.close()
                time.sleep(0.5 * (attempt + 1))
        # The leases expire and the items run again elsewhere; nothing is half-written.
        logger.error("dropped %s result(s) that could not be recorded", len(group))

    def _release_held(self) -> None:
        """Hand back what was claimed and not recorded (stopping, or the engine broke)."""
        with self._lock:
            held = list(self._held.values())
            self._held.clear()
        for item in held:
            try:
                item_release(item=item, worker_id=self.owner)
            except Exception as exc:
                logger.warning("release of item %s failed (%s)", item.pk, type(exc).__name__)
                connection.close()


class _Ahead(queue.Queue[Any]):
    """The prepared requests waiting for the engine, a bounded queue."""

    def room(self, want: int, *, timeout: float) -> int:
        """The free places, once there are at least `want` or `timeout` has passed."""
        with self.not_full:
            self.not_full.wait_for(lambda: self.maxsize - self._qsize() >= want, timeout)
            return self.maxsize - self._qsize()


def _fail_batches_of(key: EngineKey, *, message: str) -> set[str]:
    failed = set()
    deployment: dict[str, Any] = (
        {"deployment_id": key.deployment_id} if key.deployment_id else {"deployment__isnull": True}
    )
    for batch in Batch.objects.filter(
        revision_id=key.revision_id, status=Batch.Status.IN_PROGRESS, outcome="", **deployment
    ):
        if batch_fail(
            batch=batch,
            code=ErrorCode.MODEL_LOAD_FAILED,
            message="The model revision could not be loaded; no further items can run.",
        ):
            failed.add(batch.id)
    logger.error("failed %s batch(es) of %s: %s", len(failed), key, message[:200])
    return failed
