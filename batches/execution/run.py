"""One run of the stages for one engine key: claim → prepare → generate → record.

Threaded (the worker): claim and prepare run on their own thread and fill a bounded queue; the
engine thread runs one loop over the engine's verbs (add the prepared requests while the
engine has room for them, step, route the outputs); record runs on its own thread and writes
results in groups. The run's interactive feed (batches.interactive.feed) adds its requests to
the engine from its own thread as they come, and the engine's scheduler puts them first.
Inline (`threaded=False`, tests that run inside one database transaction): the same stages,
called in turn from the caller's thread.

The run claims from the queue (batches.queue.claim) and hands each claimed group to the
prepare stage; it holds what it claimed until the record stage writes it, and hands back
whatever is still held when it ends.

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

from batches.execution.prepare import Prepared, Preparer, Unpreparable, request_key
from batches.execution.record import Finished, Recorder
from batches.interactive.feed import InteractiveFeed
from batches.liveness import worker_id
from batches.models import Batch, BatchItem
from batches.queue import EngineKey, LeaseHeartbeat, item_release, items_claim_group
from boardwalk.logs import exception_trace
from inference.engine.containment import Contained
from inference.engine.protocol import GenerationEngine
from inference.engine.types import GenerationRequest, GenerationResult, PartialResult
from inference.media_layout import MediaLayout

logger = logging.getLogger(__name__)

RECORD_WINDOW_SECONDS = 0.1  # a record group gathers results for this long at most
STOPPING_POLL_SECONDS = 1.0
IDLE_POLL_SECONDS = 0.05  # a source with requests in the engine waits this long for more
_END = object()
_UNCLAIMED = object()  # to the claim+prepare stage: claim the next group
_FLUSH = object()  # to the record stage: write what you gathered without waiting


class EngineRun:
    """The stages of one run for `key`, on `engine`, until the claims or the budget end."""

    def __init__(
        self,
        key: EngineKey,
        engine: GenerationEngine,
        budget_seconds: float,
        max_items: int | None,
        on_batch_done: Callable[[str], None] | None,
        on_more_work: Callable[[], None] | None = None,
        media_layout: MediaLayout | None = None,
        *,
        tokenize: bool = True,
        claim_group: int | None = None,
    ) -> None:
        """`tokenize`: the preparer's (prepare.py); `claim_group`: items claimed at a time at
        most, where more than BOARDWALK_EXECUTION_CLAIM_GROUP."""
        self.key = key
        self.on_more_work = on_more_work
        self.engine = engine
        self.owner = worker_id()
        self.stop_at = time.monotonic() + budget_seconds
        self.remaining = max_items
        self.group_size = max(settings.EXECUTION_CLAIM_GROUP, claim_group or 0)
        self._batches: dict[str, Batch] = {}  # this run's claimed items' batches (a cache)
        self.preparer = Preparer(
            revision_id=key.revision_id,
            tokenizer=engine.tokenizer,
            media_layout=media_layout,
            tokenize=tokenize,
        )
        self.recorder = Recorder(
            owner=self.owner, on_batch_done=on_batch_done, tokenizer=engine.tokenizer
        )
        self._held: dict[str, BatchItem] = {}  # request id → item, claimed and not recorded
        self._lock = threading.Lock()
        self._stopping: frozenset[str] = frozenset()
        self.engine_broken = False
        self.feed: InteractiveFeed | None = None  # threaded runs: interactive requests
        self._in_engine: set[str] = set()  # batch requests added to the engine, no result yet

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

    def _next_group(self, room: int | None = None) -> Iterator[Prepared | Unpreparable] | None:
        """Claim a group of at most `room` items and return them as they are prepared; None
        when there is nothing more to claim. The claimed items are held (heartbeat, release)
        at once; a full group asks for one more wake-up (`on_more_work`)."""
        if not self._claim_more():
            return None
        size = min(n for n in (self.group_size, room, self.remaining) if n is not None)
        if self.feed is not None:  # rows the engine carries for interactive work are not batch's
            size = min(size, max(1, self.engine.max_batch_size - self.feed.rows()))
        claim = items_claim_group(
            key=self.key, worker_id=self.owner, limit=size, batches=self._batches
        )
        claimed = claim.items
        if claim.ended_batch_ids:
            self.recorder.check_batches(claim.ended_batch_ids)
        if not claimed:
            return None
        if self.remaining is not None:
            self.remaining -= len(claimed)
        if self.on_more_work is not None and len(claimed) >= size:
            self.on_more_work()
        for item in claimed:
            self._hold(request_key(item), item)
        return self.preparer.prepared(claimed)

    def _refresh_stopping(self) -> None:
        """Which held requests belong to batches that are stopping (cancel, expiry)."""
        with self._lock:
            held = dict(self._held)
        batch_ids = {item.batch_id for item in held.values()}
        if not batch_ids:
            self._stopping = frozenset()
            return
        stopping = set(
            Batch.objects.filter(id__in=batch_ids).stopping().values_list("id", flat=True)
        )
        self._stopping = frozenset(rid for rid, item in held.items() if item.batch_id in stopping)

    def _finished(self, result: GenerationResult) -> Finished | None:
        item = self._take(result.id)
        return None if item is None else Finished(item, result)

    def _unpreparable(self, p: Unpreparable) -> Finished:
        self._take(request_key(p.item))
        return Finished(p.item, None, p.error_code)

    def _write(self, group: list[Finished]) -> None:
        self.recorder.write(group, still_held=self.held_batches())

    # -- the engine loop, with containment --------------------------------------------------

    def _generate(
        self, source: Iterator[GenerationRequest], aborted: Callable[[], frozenset[str]]
    ) -> Iterator[GenerationResult | PartialResult]:
        """The engine's results for a pulled source (the inline run)."""
        core = self._core()
        try:
            yield from core.generate(source, aborted=aborted)
        finally:
            if core.broken:
                self.engine_broken = True  # as in `_engine_loop`

    # -- inline: the caller's thread runs every stage ----------------------------------------

    def inline(self) -> None:
        heartbeat = LeaseHeartbeat(self)
        heartbeat.start()
        try:

            def source() -> Iterator[GenerationRequest]:
                while (group := self._next_group()) is not None:
                    for p in group:
                        if isinstance(p, Prepared):
                            yield p.request
                        else:
                            self._write([self._unpreparable(p)])

            def aborted() -> frozenset[str]:
                self._refresh_stopping()
                return self._stopping

            for result in self._generate(source(), aborted):
                if isinstance(result, PartialResult):  # only interactive requests stream
                    continue
                finished = self._finished(result)
                if finished is not None:
                    self._write([finished])
        finally:
            heartbeat.stopped.set()
            self.preparer.close()
            self._release_held()

    # -- threaded: prepare and record on their own threads -----------------------------------

    def threaded(self) -> None:
        wake = threading.Event()  # something arrived for the engine loop: a request, the end
        ready = _Ready(max(2, self.engine.max_batch_size), wake)
        results: queue.Queue[Any] = queue.Queue()
        over = threading.Event()
        heartbeat = LeaseHeartbeat(self)
        core = self._core()

        def submit(request: GenerationRequest) -> None:  # the feed's: straight to the engine
            core.add(request)
            wake.set()

        self.feed = feed = InteractiveFeed(
            self.key,
            tokenizer=self.engine.tokenizer,
            context_length=self.preparer._context_length(),
            max_rows=self.engine.max_batch_size,
            engine_rows=lambda: len(self._in_engine),
            submit=submit,
        ).start()
        # The first group is claimed here, on this thread's open connection: on the prepare
        # thread's new one (PostgreSQL) the engine's first requests would wait for its set-up.
        try:
            first: Any = self._next_group(ready.maxsize)
        except Exception as exc:
            logger.warning("claim failed, the prepare stage retries: %s", exception_trace(exc))
            connection.close()
            first = _UNCLAIMED
        prepare_thread = threading.Thread(
            target=self._prepare_loop,
            args=(ready, results, over, first),
            name="prepare",
            daemon=True,
        )
        record_thread = threading.Thread(
            target=self._record_loop, args=(results,), name="record", daemon=True
        )
        for thread in (heartbeat, prepare_thread, record_thread):
            thread.start()
        try:
            for result in self._engine_loop(core, ready, wake):
                if isinstance(result, PartialResult):
                    feed.partial(result)
                    continue
                if feed.owns(result.id):
                    feed.finished(result)
                    continue
                self._in_engine.discard(result.id)
                finished = self._finished(result)
                if finished is not None:
                    results.put(finished)
                    if not self._holding():  # nothing else to wait for: write it now
                        results.put(_FLUSH)
        finally:
            over.set()
            while prepare_thread.is_alive():  # unblock a prepare stage waiting for room
                with contextlib.suppress(queue.Empty):
                    while True:
                        ready.get_nowait()
                prepare_thread.join(timeout=0.01)  # (a blocking get here waited out its timeout)
            results.put(_END)
            record_thread.join()
            feed.stop()
            heartbeat.stopped.set()
            self.preparer.close()
            self._release_held()

    def _core(self) -> GenerationEngine:
        """The engine with failures contained (see module doc): the engine process contains
        its own; an engine in this process is wrapped."""
        return self.engine if self.engine.contains_failures else Contained(self.engine)

    def _engine_loop(
        self, core: GenerationEngine, ready: _Ready, wake: threading.Event
    ) -> Iterator[GenerationResult | PartialResult]:
        """The run's one loop over the engine's verbs: add the prepared batch requests while
        the engine has room for them (its `credit`), pass on the aborts, step, and yield the
        outputs; until the prepare stage ends and the engine holds nothing more. Interactive
        requests are added by the feed's thread (`submit`), whenever they come: the engine's
        scheduler puts them ahead of batch."""
        ended = False
        sent_aborts: frozenset[str] = frozenset()
        feed = self.feed
        if feed is None:
            raise RuntimeError("the engine loop runs with the run's interactive feed")

        def interrupt() -> bool:  # a decoding run ends for a request that has room now
            return wake.is_set() and ready.qsize() > 0 and len(self._in_engine) < core.credit

        try:
            while True:
                wake.clear()
                while not ended and len(self._in_engine) < core.credit:
                    try:
                        request = ready.get_nowait()
                    except queue.Empty:
                        break
                    if request is _END:
                        ended = True
                        break
                    self._in_engine.add(request.id)
                    core.add(request)
                # A stopping batch's row is aborted once it is in the engine: one still in
                # `ready` when its batch began stopping is aborted when it is added, not
                # counted as aborted before (it would then run to its end).
                stopping = (self._stopping & self._in_engine) | feed.aborted()
                if stopping - sent_aborts:
                    core.abort(stopping - sent_aborts)
                sent_aborts = stopping
                if core.broken:
                    return
                if not core.has_unfinished:
                    if ended:
                        return
                    wake.wait(IDLE_POLL_SECONDS * 10)
                    continue
                yield from core.step(wait=IDLE_POLL_SECONDS, interrupt=interrupt)
        finally:
            if core.broken:
                # Not one request: the engine itself is broken. Stop; whatever is still
                # held goes back to the queue and its attempts already count.
                self.engine_broken = True
            elif self._in_engine:
                # The loop was left early: what this run added is its own to hand back, so
                # the engine stops it (its aborted results reach no later run's items).
                core.abort(set(self._in_engine))

    def _prepare_loop(
        self, ready: _Ready, results: queue.Queue[Any], over: Any, first: Any = None
    ) -> None:
        """`first`: the group `threaded` claimed already (None: nothing was left to claim),
        or `_UNCLAIMED`."""
        ended = False
        # Claim only what the queue can take, once it has room for half a group: an item
        # claimed while the queue is full waits in this worker, not on the engine, and a
        # worker that dies takes its claims with it until its leases are recovered (a queue
        # and a group ready of a full engine were 48 items to re-run behind the others).
        want = max(1, min(self.group_size, ready.maxsize) // 2)
        try:
            last_poll = 0.0
            group = first
            while not over.is_set():
                if group is _UNCLAIMED:
                    room = ready.room(want, timeout=STOPPING_POLL_SECONDS)
                    if room < want:
                        last_poll = self._poll_stopping(last_poll)
                        continue
                    try:
                        group = self._next_group(room)
                    except Exception as exc:
                        logger.warning("claim failed; retrying: %s", exception_trace(exc))
                        connection.close()
                        if over.wait(1.0):
                            break
                        continue
                if group is None:
                    # Nothing to claim: a run serving interactive requests stays up for them,
                    # and looks for batch work again now and then.
                    if self.feed is not None and self.feed.lingering():
                        if over.wait(STOPPING_POLL_SECONDS):
                            break
                        group = _UNCLAIMED
                        continue
                    break
                for p in group:
                    if over.is_set():  # the rest stay held, and are handed back
                        break
                    if isinstance(p, Unpreparable):
                        results.put(self._unpreparable(p))
                        continue
                    while not over.is_set():
                        try:
                            ready.put(p.request, timeout=STOPPING_POLL_SECONDS)
                            break
                        except queue.Full:
                            last_poll = self._poll_stopping(last_poll)
                group = _UNCLAIMED
                last_poll = self._poll_stopping(last_poll)
            ready.put(_END)
            ended = True
            while not over.wait(STOPPING_POLL_SECONDS):
                last_poll = self._poll_stopping(last_poll)
        finally:
            if not ended:  # whatever went wrong, the engine must not wait for more
                while not over.is_set():
                    try:
                        ready.put(_END, timeout=STOPPING_POLL_SECONDS)
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
            logger.warning("stopping check failed: %s", exception_trace(exc))
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
                    "recording %s result(s) failed, attempt %s: %s",
                    len(group),
                    attempt + 1,
                    exception_trace(exc),
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
                logger.warning("release of item %s failed: %s", item.pk, exception_trace(exc))
                connection.close()


class _Ready(queue.Queue[Any]):
    """The prepared batch requests waiting for the engine loop, a bounded queue; each put
    sets `wake`, which the engine loop waits on when it holds nothing."""

    def __init__(self, maxsize: int, wake: threading.Event) -> None:
        super().__init__(maxsize)
        self.wake = wake

    def _put(self, item: Any) -> None:
        super()._put(item)
        self.wake.set()

    def room(self, want: int, *, timeout: float) -> int:
        """The free places, once there are at least `want` or `timeout` has passed."""
        with self.not_full:
            self.not_full.wait_for(lambda: self.maxsize - self._qsize() >= want, timeout)
            return self.maxsize - self._qsize()
