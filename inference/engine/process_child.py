"""The child side of the engine process: what runs in the process `EngineProcess` starts.

process.py is the parent side and describes the protocol both sides speak (its docstring's
"Protocol" paragraph). Here: `child_main`, rank 0's entry point, which builds the revision's
engine, says it is ready and then serves the parent's commands; `_child_run`, one run of
requests over the pipes, read by the engine's own thread between its steps (`_RunInbox`); and
`follower_main`, the entry point of every other rank of a tensor-parallel engine
(lockstep.py). The entry points are top-level functions: the process is started with `spawn`,
which pickles them by module path.

Nothing here imports Django; torch and transformers load when the engine is built.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable, Collection, Iterator
from typing import Any

from .config import EngineConfig
from .lockstep import RankSetup
from .types import NOT_READY, GenerationRequest, PartialResult


def _build_engine(
    load: dict[str, Any],
    config: EngineConfig,
    with_processor: bool,
    setup: RankSetup | None,
) -> tuple[Any, Any]:
    """(engine, channel): the revision's engine in this process; on a rank of a
    tensor-parallel engine, this rank's part of it and the leader's broadcasts."""
    from .engine import Engine
    from .loading import load_model, load_processor

    channel = None
    check = None
    if setup is not None:
        from .lockstep import agree_on_pool, init_ranks, lockstep_config, ranks_check

        channel, device = init_ranks(setup)
        load = {**load, "device": device, "tensor_parallel_size": setup.size}
        config = lockstep_config(config)
        check = ranks_check(channel)
    model, tokenizer = load_model(**load)
    processor = (
        load_processor(load["weights"], revision=load.get("revision")) if with_processor else None
    )

    def build(engine_config: EngineConfig) -> Any:
        return Engine(model, tokenizer, engine_config, processor=processor, ranks_check=check)

    if channel is None:
        return build(config), None
    return agree_on_pool(build, config, channel), channel


def follower_main(
    report: Any,
    load: dict[str, Any],
    config: EngineConfig,
    with_processor: bool,
    setup: RankSetup,
) -> None:
    """A rank other than the first: follows rank 0 (lockstep.follow) until it closes."""
    from .lockstep import LockstepBroken, follow, rank_environment

    rank_environment(setup)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        engine, channel = _build_engine(load, config, with_processor, setup)
        follow(engine, channel)
    except (Exception, LockstepBroken) as exc:
        with contextlib.suppress(OSError):
            report.send(f"{type(exc).__name__}: {exc}")
        raise SystemExit(1) from exc


def child_main(
    inbox: Any,
    outbox: Any,
    load: dict[str, Any],
    config: EngineConfig,
    with_processor: bool,
    setup: RankSetup | None = None,
) -> None:
    if setup is not None:
        from .lockstep import rank_environment

        rank_environment(setup)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        engine, channel = _build_engine(load, config, with_processor, setup)
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
