"""The engine in a process of its own, fed over pipes (one per worker process and revision).

Why: the worker's prepare and record stages are Python (claims, decryption, JSON, chat
templates, the record transactions), and so is most of a transformers forward. In one process
they share one interpreter lock, so every millisecond of prepare or record is a millisecond
the engine does not step: on a small model the engine ran 20-30 % slower inside the worker
than alone. In its own process the engine thread only ever waits for the pipe.

`EngineProcess` is a `GenerationEngine` (protocol.py) like the `Engine` it runs, and contains
failures itself (`contains_failures`): a request that makes the engine raise is isolated in
the child (containment.py) and comes back as its `internal_error` result; `broken` says the
engine as a whole failed, or the child died (killed, out of host memory), and the process is
unusable.

Protocol: the engine core's verbs over the pipes, as vLLM's engine core process takes them.
Parent to child, at any time: ("add", GenerationRequest), ("abort", ids),
("clear_prefix_cache",) (only while nothing is held) and ("close",). Child to parent:
("partial", PartialResult) for a streaming request's new text, ("result", GenerationResult)
once for every request added, ("ok", None) after clearing the cache, and ("broken", None) when
the engine as a whole failed (it then takes nothing more). The child is a busy loop: it takes
every message waiting, steps while it holds anything, and sends the step's outputs.

The parent has the same verbs (`add`, `abort`, `step`, which returns the outputs that have
arrived) and `generate`, a loop over them that feeds a source at most `credit` requests ahead
of their results (its bookkeeping: process_feeding.py), so a short queue of ready requests
waits in the child's engine (it never waits on the pipe while the worker keeps up) and the
rest wait, claimed, in the worker.
Interactive requests (priority > 0) go past the credit; in the child the engine's scheduler
puts them ahead of batch (scheduler.py). A call
abandoned by its caller aborts what it left in the child, whose results are then dropped.

Threads: the child (process_child.py) has one, the engine's, which reads its pipe between
steps. So a send to it can wait while a step runs; in the parent one sender thread makes every
send, and the reader of results never waits on the pipe.

With `tensor_parallel_size` N > 1 the engine runs across N child processes, one per rank
(lockstep.py): the parent talks to rank 0 alone, as above; the other ranks follow rank 0's
broadcasts and only ever tell the parent why they failed. Any rank dying makes the whole
engine broken, and closing it stops every rank.

Nothing here imports Django; the child imports torch and transformers, the parent does not
need them for this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from .config import EngineConfig
from .lockstep import RankSetup
from .process_child import child_main, follower_main
from .process_feeding import Credit, Feeding
from .types import GenerationRequest, GenerationResult, PartialResult

logger = logging.getLogger(__name__)

_START_TIMEOUT_SECONDS = 900.0  # loading a large model from a slow disk
_POLL_SECONDS = 0.5  # how often a run checks the abort set and that the child lives
_SENDER_JOIN_SECONDS = 10.0  # the last messages reach a live child at once


class EngineProcessError(Exception):
    """The engine process could not start (its model failed to load) or died."""


class EngineProcess:
    contains_failures = True

    def __init__(
        self,
        *,
        load: dict[str, Any],
        config: EngineConfig,
        tokenizer: Any,
        with_processor: bool = False,
        credit: int | None = None,
        tensor_parallel_size: int = 1,
    ) -> None:
        """`load`: keyword arguments of `load_model`; `config`: the engine's (config.py),
        sent to the child as it is; `tokenizer`: the parent's own copy of the
        revision's tokenizer (prepare renders and tokenizes prompts with it);
        `tensor_parallel_size`: the ranks the engine runs across (`load["device"]` is the
        first one's)."""
        context = multiprocessing.get_context("spawn")  # never fork a threaded worker
        inbox, self._to_child = context.Pipe(duplex=False)
        self._from_child, outbox = context.Pipe(duplex=False)
        self._store_dir: str | None = None
        setups: list[RankSetup | None] = [None]
        if tensor_parallel_size > 1:
            self._store_dir = tempfile.mkdtemp(prefix="boardwalk-ranks-")
            store = f"{self._store_dir}/store"
            device = load.get("device")
            setups = [
                RankSetup(rank=r, size=tensor_parallel_size, store=store, device=device)
                for r in range(tensor_parallel_size)
            ]
        self._process = context.Process(
            target=child_main,
            args=(inbox, outbox, load, config, with_processor, setups[0]),
            name="boardwalk-engine",
            daemon=True,
        )
        # The other ranks: each with a pipe that only ever carries why it failed.
        self._followers: list[tuple[Any, Any]] = []
        for setup in setups[1:]:
            report, their_end = context.Pipe(duplex=False)
            follower = context.Process(
                target=follower_main,
                args=(their_end, load, config, with_processor, setup),
                name=f"boardwalk-engine-rank{setup.rank if setup else 0}",
                daemon=True,
            )
            self._followers.append((follower, report))
            follower.start()
            their_end.close()
        self._process.start()
        inbox.close()
        outbox.close()
        self._send_lock = threading.Lock()
        self.tokenizer = tokenizer
        self.broken = False
        try:
            kind, info = self._receive(_START_TIMEOUT_SECONDS)
        except EngineProcessError:
            self.close()
            raise
        if kind != "ready":
            reason = self._follower_failure() or str(info)
            self.close()
            raise EngineProcessError(reason)
        self.max_batch_size: int = info["max_batch_size"]
        self.media_modalities = frozenset(info["media_modalities"])
        self.credit = credit or 2 * self.max_batch_size
        self._lock = threading.Lock()
        self._unanswered: set[str] = set()  # added, no result yet
        self._dropped: set[str] = set()  # of those, the ones an abandoned call left
        # Every send goes through one thread: the child reads its pipe only between steps, so
        # a send can wait on a full pipe, and the reader of results must never be the one.
        self._outgoing: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_all, name="engine-send", daemon=True)
        self._sender.start()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    # -- the verbs ---------------------------------------------------------------------------

    def add(self, request: GenerationRequest) -> None:
        """Queue a request in the child's engine; its result comes out of a later `step`."""
        with self._lock:
            self._unanswered.add(request.id)
        if request.body is not None:  # the child generates from the ids: not pickled over
            request = dataclasses.replace(request, body=None)
        self._outgoing.put(("add", request))

    def abort(self, request_ids: Collection[str]) -> None:
        """Stop these requests (those not answered yet); their results come back aborted."""
        with self._lock:
            ids = sorted(self._unanswered.intersection(request_ids))
        if ids:
            self._outgoing.put(("abort", ids))

    @property
    def has_unfinished(self) -> bool:
        """Whether a request added has no result yet."""
        with self._lock:
            return bool(self._unanswered)

    def step(
        self, *, wait: float = 0.0, interrupt: Callable[[], bool] | None = None
    ) -> list[GenerationResult | PartialResult]:
        """The outputs the child has sent, waiting up to `wait` seconds for the first (the
        child steps on its own, and ends a decoding run itself when a message comes: no
        `interrupt` is needed). Sets `broken` when its engine broke or the child died (then
        closed); what was not answered is the caller's to hand back."""
        outputs: list[GenerationResult | PartialResult] = []
        if self.broken:
            return outputs
        try:
            self._collect(outputs, wait)
        except EngineProcessError as exc:
            logger.error("engine process %s died: %s", self.pid, exc)
            self.broken = True
            self.close()
        if self.broken:
            with self._lock:
                self._unanswered.clear()
        return outputs

    def _collect(self, outputs: list[GenerationResult | PartialResult], wait: float) -> None:
        kind, payload = self._receive(wait, idle_ok=True)
        while kind != "idle":
            if kind == "broken":
                self.broken = True
                return
            with self._lock:
                dropped = payload.id in self._dropped
                if kind == "result":
                    self._unanswered.discard(payload.id)
                    self._dropped.discard(payload.id)
            if not dropped and kind in ("result", "partial"):
                outputs.append(payload)
            try:
                if not self._from_child.poll(0):
                    return
                kind, payload = self._from_child.recv()
            except (EOFError, OSError, ValueError) as exc:  # the child's end is gone
                raise EngineProcessError(self._death()) from exc

    # -- the pull loop -----------------------------------------------------------------------

    def generate(
        self,
        requests: Iterable[GenerationRequest],
        *,
        aborted: Callable[[], Collection[str]] | None = None,
    ) -> Iterator[GenerationResult | PartialResult]:
        """Results as the child yields them (in completion order), and the partials of
        streaming requests. Sets `broken` and returns early when the engine broke or the
        child died; unanswered requests are the caller's to hand back. An interactive
        request (priority > 0) is sent past the credit."""
        if self.broken:
            raise EngineProcessError("the engine process is broken")
        credit = Credit(self.credit)
        feeding = Feeding()
        feeder = threading.Thread(
            target=self._feed, args=(requests, credit, feeding), name="engine-feed", daemon=True
        )
        sent_abort: set[str] = set()
        clean = False
        try:
            feeder.start()
            while True:
                if aborted is not None:
                    ids = set(aborted()) - sent_abort
                    if ids:
                        sent_abort |= ids
                        self.abort(ids)
                for output in self.step(wait=_POLL_SECONDS):
                    if isinstance(output, GenerationResult):
                        feeding.answered(output.id)
                        credit.release()
                    yield output
                if self.broken or feeding.over():
                    clean = True
                    return
        finally:
            left = feeding.stop()
            if not clean and left:
                # The caller stopped mid-run: what it left in the child is aborted there,
                # and its results (aborted) are dropped when they come.
                with self._lock:
                    self._dropped.update(left)
                self._outgoing.put(("abort", sorted(left)))
            if feeder.is_alive():
                feeder.join(timeout=_POLL_SECONDS * 2)

    def _feed(
        self, requests: Iterable[GenerationRequest], credit: Credit, feeding: Feeding
    ) -> None:
        try:
            for request in requests:
                while not credit.acquire(_POLL_SECONDS, interactive=request.priority > 0):
                    if feeding.stopped:
                        return
                if not feeding.sent(request.id):  # the call ended while this one waited
                    return
                self.add(request)
        finally:
            feeding.exhausted()

    def _send_all(self) -> None:
        """Send every message in order until None; a dead child ends it (the reader of
        results finds out on its own)."""
        while (message := self._outgoing.get()) is not None:
            try:
                self._send(message)
            except EngineProcessError:
                return

    def clear_prefix_cache(self) -> None:
        self._outgoing.put(("clear_prefix_cache",))
        while True:  # (nothing is held: no result comes before its answer)
            kind, _ = self._receive(_START_TIMEOUT_SECONDS)
            if kind == "ok":
                return

    def close(self) -> None:
        """Stop the child (every rank): asked first, then terminated."""
        sender = getattr(self, "_sender", None)
        if sender is not None and sender.is_alive():
            self._outgoing.put(("close",))
            self._outgoing.put(None)
            sender.join(timeout=_SENDER_JOIN_SECONDS)
        else:
            with contextlib.suppress(EngineProcessError):
                self._send(("close",))
        for process in [self._process, *(f for f, _ in self._followers)]:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        self._to_child.close()
        self._from_child.close()
        for _, report in self._followers:
            report.close()
        if self._store_dir is not None:
            shutil.rmtree(self._store_dir, ignore_errors=True)

    def _death(self) -> str:
        """Why the engine died: a follower's reason first (rank 0 then fails for want of it)."""
        return self._follower_failure() or f"exit code {self._process.exitcode}"

    def _follower_failure(self) -> str | None:
        """What a rank other than the first said when it failed, or that it died."""
        for follower, report in self._followers:
            with contextlib.suppress(EOFError, OSError, ValueError):
                if report.poll(0):
                    return f"{follower.name}: {report.recv()}"
            if not follower.is_alive():
                return f"{follower.name} exited with code {follower.exitcode}"
        return None

    def _send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            try:
                self._to_child.send(message)
            except (OSError, ValueError) as exc:  # the child's end is gone, or closed here
                raise EngineProcessError(type(exc).__name__) from exc

    def _receive(self, timeout: float, *, idle_ok: bool = False) -> tuple[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._from_child.poll(min(_POLL_SECONDS, max(0.0, deadline - time.monotonic()))):
                    return self._from_child.recv()
            except (EOFError, OSError, ValueError) as exc:  # the child's end is gone
                raise EngineProcessError(self._death()) from exc
            if not self._process.is_alive():
                raise EngineProcessError(self._death())
            failure = self._follower_failure()
            if failure is not None:  # rank 0 would wait for it in its next collective
                raise EngineProcessError(failure)
            if time.monotonic() >= deadline:
                if idle_ok:
                    return ("idle", None)
                raise EngineProcessError(f"no answer in {timeout:.0f} s")
