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

Protocol, one run at a time. Parent to child: ("run",), then ("request", GenerationRequest)
and ("abort", ids) in any order, ("end",) when there are no more requests (aborts may still
follow), and ("over",) once the child said it is done. Child to parent: ("result",
GenerationResult) for each request (a streaming one's ("partial", PartialResult) before it),
then ("done", broken). At most `credit` requests are in
the child without a result, so a short queue of ready requests waits in the pipe (the engine
never waits on it while the worker keeps up) and the rest wait, claimed, in the worker.
Interactive requests (priority > 0) go past the credit while the run's `urgent()` says one is
next, and the child hands them to its engine ahead of the batch requests in its pipe.

Threads: the child has one, the engine's, which reads its inbox between steps (`_RunInbox`).
So a send to it can wait while a step runs; in the parent one sender thread makes every send
of a run, and the run's loop, the only reader of results, never waits on the pipe.

With `tensor_parallel_size` N > 1 the engine runs across N child processes, one per rank
(lockstep.py): the parent talks to rank 0 alone, as above; the other ranks follow rank 0's
broadcasts and only ever tell the parent why they failed. Any rank dying makes the whole
engine broken, and closing it stops every rank.

Nothing here imports Django; the child imports torch and transformers, the parent does not
need them for this module.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import queue
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from .lockstep import RankSetup
from .types import NOT_READY, GenerationRequest, GenerationResult, PartialResult

logger = logging.getLogger(__name__)

_START_TIMEOUT_SECONDS = 900.0  # loading a large model from a slow disk
_POLL_SECONDS = 0.5  # how often a run checks the abort set and that the child lives
_URGENT_POLL_SECONDS = 0.01  # how often a feeder out of credit asks whether one is urgent
_SENDER_JOIN_SECONDS = 10.0  # a run's last messages reach a live child at once
_END = ("end",)
_OVER = ("over",)


class EngineProcessError(Exception):
    """The engine process could not start (its model failed to load) or died."""


class EngineProcess:
    contains_failures = True

    def __init__(
        self,
        *,
        load: dict[str, Any],
        engine_options: dict[str, Any],
        tokenizer: Any,
        with_processor: bool = False,
        credit: int | None = None,
        tensor_parallel_size: int = 1,
    ) -> None:
        """`load`: keyword arguments of `load_model`; `engine_options`: of `Engine` (besides
        the model, tokenizer and processor); `tokenizer`: the parent's own copy of the
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
            target=_child_main,
            args=(inbox, outbox, load, engine_options, with_processor, setups[0]),
            name="boardwalk-engine",
            daemon=True,
        )
        # The other ranks: each with a pipe that only ever carries why it failed.
        self._followers: list[tuple[Any, Any]] = []
        for setup in setups[1:]:
            report, their_end = context.Pipe(duplex=False)
            follower = context.Process(
                target=_follower_main,
                args=(their_end, load, engine_options, with_processor, setup),
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

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def generate(
        self,
        requests: Iterable[GenerationRequest],
        *,
        aborted: Callable[[], Collection[str]] | None = None,
        urgent: Callable[[], bool] | None = None,
    ) -> Iterator[GenerationResult | PartialResult]:
        """Results as the child yields them (in completion order), and the partials of
        streaming requests. Sets `broken` and returns early when the engine broke or the
        child died; unanswered requests are the caller's to hand back. `urgent()`: whether
        the source's next request is interactive (it is then sent past the credit)."""
        if self.broken:
            raise EngineProcessError("the engine process is broken")
        credit = _Credit(self.credit, urgent)
        stop = threading.Event()
        clean = False
        # Everything this run sends goes through one thread: the child reads its inbox only
        # between steps, so a send can wait on a full pipe, and the loop below (the only
        # reader of the child's results) must never be the one waiting.
        outgoing: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        sender = threading.Thread(
            target=self._send_all, args=(outgoing,), name="engine-send", daemon=True
        )
        feeder = threading.Thread(
            target=self._feed,
            args=(requests, credit, stop, outgoing),
            name="engine-feed",
            daemon=True,
        )
        sent_abort: frozenset[str] = frozenset()
        try:
            self._send(("run",))
            sender.start()
            feeder.start()
            while True:
                if aborted is not None:
                    ids = frozenset(aborted())
                    if ids != sent_abort:
                        outgoing.put(("abort", sorted(ids)))
                        sent_abort = ids
                kind, payload = self._receive(_POLL_SECONDS, idle_ok=True)
                if kind == "result":
                    credit.release()
                    yield payload
                elif kind == "partial":
                    yield payload
                elif kind == "done":
                    self.broken = bool(payload)
                    outgoing.put(_OVER)  # after the feeder's end: the child had it to be done
                    clean = True
                    return
        except EngineProcessError as exc:
            logger.error("engine process %s died: %s", self.pid, exc)
        finally:
            stop.set()
            if not clean:  # died, or the caller stopped mid-run: the child's state is unknown
                self.broken = True
                self.close()
            if feeder.is_alive():
                feeder.join(timeout=_POLL_SECONDS * 2)
            outgoing.put(None)
            sender.join(timeout=_SENDER_JOIN_SECONDS)
            if sender.is_alive():  # stuck sending to a child that reads nothing: unusable
                self.broken = True
                self._process.kill()  # (its pipe then fails the stuck send)
                self.close()

    def _feed(
        self,
        requests: Iterable[GenerationRequest],
        credit: _Credit,
        stop: threading.Event,
        outgoing: queue.SimpleQueue[tuple[Any, ...] | None],
    ) -> None:
        try:
            for request in requests:
                while not credit.acquire(_POLL_SECONDS, interactive=request.priority > 0):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                outgoing.put(("request", request))
        finally:
            outgoing.put(_END)

    def _send_all(self, outgoing: queue.SimpleQueue[tuple[Any, ...] | None]) -> None:
        """Send a run's messages in order until None; a dead child ends it (the run's
        reader finds out on its own)."""
        while (message := outgoing.get()) is not None:
            try:
                self._send(message)
            except EngineProcessError:
                return

    def clear_prefix_cache(self) -> None:
        self._send(("clear_prefix_cache",))
        self._receive(_START_TIMEOUT_SECONDS)

    def close(self) -> None:
        """Stop the child (every rank): asked first, then terminated."""
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


class _Credit:
    """Requests the child may hold without a result. When it is spent, an interactive request
    goes past it, and so does a batch one while `urgent()` says an interactive one is next
    (what was overdrawn comes back before any credit is given again)."""

    def __init__(self, credit: int, urgent: Callable[[], bool] | None) -> None:
        self._free = threading.Semaphore(credit)
        self._urgent = urgent
        self._lock = threading.Lock()
        self._overdrawn = 0

    def acquire(self, timeout: float, *, interactive: bool) -> bool:
        if self._urgent is None and not interactive:
            return self._free.acquire(timeout=timeout)
        deadline = time.monotonic() + timeout
        while not self._free.acquire(timeout=0 if interactive else _URGENT_POLL_SECONDS):
            if interactive or (self._urgent is not None and self._urgent()):
                with self._lock:
                    self._overdrawn += 1
                return True
            if time.monotonic() >= deadline:
                return False
        return True

    def release(self) -> None:
        with self._lock:
            if self._overdrawn:
                self._overdrawn -= 1
                return
        self._free.release()


# -- the child ------------------------------------------------------------------------------


def _build_engine(
    load: dict[str, Any],
    engine_options: dict[str, Any],
    with_processor: bool,
    setup: RankSetup | None,
) -> tuple[Any, Any]:
    """(engine, channel): the revision's engine in this process; on a rank of a
    tensor-parallel engine, this rank's part of it and the leader's broadcasts."""
    from .engine import Engine
    from .loading import load_model, load_processor

    channel = None
    if setup is not None:
        from .lockstep import agree_on_pool, init_ranks, lockstep_options, ranks_check

        channel, device = init_ranks(setup)
        load = {**load, "device": device, "tensor_parallel_size": setup.size}
        engine_options = {**lockstep_options(engine_options), "ranks_check": ranks_check(channel)}
    model, tokenizer = load_model(**load)
    processor = (
        load_processor(load["weights"], revision=load.get("revision")) if with_processor else None
    )

    def build(options: dict[str, Any]) -> Any:
        return Engine(model, tokenizer, processor=processor, **options)

    if channel is None:
        return build(engine_options), None
    return agree_on_pool(build, engine_options, channel), channel


def _follower_main(
    report: Any,
    load: dict[str, Any],
    engine_options: dict[str, Any],
    with_processor: bool,
    setup: RankSetup,
) -> None:
    """A rank other than the first: follows rank 0 (lockstep.follow) until it closes."""
    from .lockstep import LockstepBroken, follow, rank_environment

    rank_environment(setup)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        engine, channel = _build_engine(load, engine_options, with_processor, setup)
        follow(engine, channel)
    except (Exception, LockstepBroken) as exc:
        with contextlib.suppress(OSError):
            report.send(f"{type(exc).__name__}: {exc}")
        raise SystemExit(1) from exc


def _child_main(
    inbox: Any,
    outbox: Any,
    load: dict[str, Any],
    engine_options: dict[str, Any],
    with_processor: bool,
    setup: RankSetup | None = None,
) -> None:
    if setup is not None:
        from .lockstep import rank_environment

        rank_environment(setup)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        engine, channel = _build_engine(load, engine_options, with_processor, setup)
    except Exception as exc:
        outbox.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    outbox.send(
        (
            "ready",
            {
                "max_batch_size": engine.max_batch_size,
                "media_modalities": sorted(engine.media_modalities),
            },
        )
    )
    while True:
        try:
            message = inbox.recv()
        except (EOFError, OSError):
            message = ("close",)  # the worker is gone
        if channel is not None and message[0] in ("run", "clear_prefix_cache", "close"):
            channel.share((message[0],))
        if message[0] == "run":
            _child_run(engine, inbox, outbox, channel)
        elif message[0] == "clear_prefix_cache":
            engine.clear_prefix_cache()
            outbox.send(("ok", None))
        elif message[0] == "close":
            return
        # Anything else is the tail of a run that broke (a request or an end the parent's
        # feeder sent after "over"): ignored.


class _RunInbox:
    """The child's end of one run's messages, read by the engine's own thread between its
    steps (`drain`), never by a thread of its own: a receiving thread woke for every request
    and took the interpreter lock from the engine each time, which cost the child ~3-5 % of
    the engine's speed alone on the tiny model. Requests wait in the pipe until the next
    step asks for them; the parent's sender thread is the one that waits when it is full."""

    def __init__(self, inbox: Any) -> None:
        self._inbox = inbox
        self.pending: deque[GenerationRequest] = deque()
        self.aborted: frozenset[str] = frozenset()
        self.received: set[str] = set()
        self.urgent = 0  # interactive requests in `pending`
        self.ended = False  # ("end",): no more requests (or the worker is gone)
        self.over = False  # ("over",): the parent took the run's last message
        self.orphaned = False  # the worker is gone: stop everything, answer nobody

    def drain(self, *, block: bool = False) -> None:
        """Take every message already there; with `block`, wait for one first."""
        try:
            if block:
                self._take(self._inbox.recv())
            # Whatever follows "over" is the parent's next command, not this run's.
            while not self.over and self._inbox.poll(0):
                self._take(self._inbox.recv())
        except (EOFError, OSError):
            self.orphaned = self.ended = True

    def next_request(self) -> GenerationRequest:
        """The first interactive request pending, else the oldest."""
        if self.urgent:
            for request in self.pending:
                if request.priority > 0:
                    self.pending.remove(request)
                    self.urgent -= 1
                    return request
        return self.pending.popleft()

    def _take(self, message: tuple[Any, ...]) -> None:
        if message[0] == "request":
            self.received.add(message[1].id)
            self.pending.append(message[1])
            self.urgent += message[1].priority > 0
        elif message[0] == "abort":
            self.aborted = frozenset(message[1])
        elif message[0] == "end":
            self.ended = True
        elif message[0] == "over":
            self.over = True


def _child_run(engine: Any, inbox: Any, outbox: Any, channel: Any = None) -> None:
    from .containment import Contained

    messages = _RunInbox(inbox)
    contained = Contained(engine)
    leader = None
    if channel is not None:
        from .lockstep import Leader

        leader = Leader(channel)

    def source() -> Iterator[GenerationRequest]:
        # Never blocks an engine that has rows to step: a request still on its way through
        # the pipe joins at a later step (at a run's start the engine waited for a whole
        # engine's width of requests to arrive, one by one, before its first step).
        while True:
            messages.drain()
            if messages.pending:
                yield messages.next_request()
            elif messages.ended:
                return
            elif contained.holding():
                yield NOT_READY
            else:
                messages.drain(block=True)

    def stopped() -> Collection[str]:
        # An orphan aborts what it holds (within the engine's abort poll, 0.5 s of work)
        # instead of computing results nobody can receive on a device a new worker needs.
        messages.drain()
        return set(messages.received) if messages.orphaned else messages.aborted

    def urgent() -> bool:
        messages.drain()
        return messages.urgent > 0

    requests, poll = source(), stopped
    # Ranks in lockstep pull only as the followers can replay: past the rows never.
    pull_urgent: Callable[[], bool] | None = urgent
    if leader is not None:  # every answer to the engine reaches the other ranks too
        requests, poll, pull_urgent = leader.source(requests), leader.aborted(stopped), None
    for result in contained.generate(requests, aborted=poll, urgent=pull_urgent):
        messages.drain()  # a full engine asks its source nothing: notice an orphan here too
        if messages.orphaned:
            continue
        if isinstance(result, PartialResult):
            with contextlib.suppress(OSError):
                outbox.send(("partial", result))
            continue
        if leader is not None:
            result = leader.result(result)
        try:
            outbox.send(("result", result))
        except OSError:  # the worker's end is closed
            messages.orphaned = True
    if messages.orphaned:
        raise SystemExit(0)
    outbox.send(("done", contained.broken))
    while not (messages.over or messages.orphaned):  # the next message is a command again
        messages.drain(block=True)
