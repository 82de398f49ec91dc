"""The child side of the engine process: what runs in the process `EngineProcess` starts.

process.py is the parent side and describes the protocol both sides speak (its docstring's
"Protocol" paragraph). Here: `child_main`, rank 0's entry point, which builds the revision's
engine, says it is ready and then serves the parent (`_serve`): a busy loop over the engine
core's verbs, as vLLM's engine core process is: take every message waiting in the pipe (add,
abort), step, send the outputs; and `follower_main`, the entry point of every other rank of a
tensor-parallel engine (lockstep.py), which applies the verbs rank 0 applies. The entry
points are top-level functions: the process is started with `spawn`, which pickles them by
module path.

Nothing here imports Django; torch and transformers load when the engine is built.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable, Collection
from typing import Any

from .config import EngineConfig
from .lockstep import RankSetup
from .types import PartialResult


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
    agree = None
    if setup is not None:
        from .lockstep import agree_on_pool, agreement, init_ranks, ranks_check

        channel, device = init_ranks(setup)
        load = {**load, "device": device, "tensor_parallel_size": setup.size}
        check = ranks_check(channel)
        agree = agreement(channel)
    model, tokenizer = load_model(**load)
    processor = (
        load_processor(load["weights"], revision=load.get("revision")) if with_processor else None
    )

    def build(engine_config: EngineConfig) -> Any:
        return Engine(
            model, tokenizer, engine_config, processor=processor, ranks_check=check, agree=agree
        )

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
    _serve(engine, inbox, outbox, channel)


class _Inbox:
    """The parent's messages, read by the engine's own thread between its steps, never by a
    thread of its own: a receiving thread woke for every request and took the interpreter lock
    from the engine each time, which cost the child ~3-5 % of the engine's speed alone on the
    tiny model. Messages wait in the pipe until the next step is over; the parent's sender
    thread is the one that waits when it is full."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = pipe
        self.pending: deque[tuple[Any, ...]] = deque()
        self.orphaned = False  # the worker is gone: stop everything, answer nobody

    def read(self, *, block: bool) -> None:
        """Take every message already there; with `block`, wait for one first."""
        try:
            if block and not self.pending:
                self.pending.append(self._pipe.recv())
            while self._pipe.poll(0):
                self.pending.append(self._pipe.recv())
        except (EOFError, OSError):
            self.orphaned = True

    def pressing(self, room: bool) -> bool:
        """Whether a message waiting should end a decoding run now: an abort, a command, an
        interactive request, or a batch request while the engine has a row free (`room`).
        One more batch request for a full engine waits for the run's end, as it would in the
        engine's queue."""
        self.read(block=False)
        if self.orphaned:
            return True
        if any(m[0] != "add" or m[1].priority > 0 for m in self.pending):
            return True
        return bool(self.pending) and room

    def aborted(self) -> frozenset[str]:
        """The ids of the aborts waiting (what a request run alone polls, containment.py)."""
        self.read(block=False)
        return frozenset(i for m in self.pending if m[0] == "abort" for i in m[1])


def _serve(engine: Any, pipe: Any, outbox: Any, channel: Any = None) -> None:
    """Apply the parent's messages and step while anything is held, until "close" or the
    parent is gone (an orphan drops its work at once: nobody can receive its results, and the
    device is the next worker's)."""
    from .containment import Contained

    inbox = _Inbox(pipe)
    leader = None
    alone_aborted: Callable[[], Collection[str]] = inbox.aborted
    if channel is not None:
        from .lockstep import Leader

        leader = Leader(channel)
        alone_aborted = leader.aborted(inbox.aborted)
    core = Contained(engine, alone_aborted=alone_aborted)
    told_broken = False

    def pressing() -> bool:
        return inbox.pressing(engine.rows_in_use < engine.max_batch_size)

    while True:
        inbox.read(block=not core.has_unfinished or core.broken)
        if inbox.orphaned:
            raise SystemExit(0)
        while inbox.pending:
            message = inbox.pending.popleft()
            if message[0] in ("add", "abort") and core.broken:
                continue  # the parent ends its run when it reads "broken"
            if leader is not None:  # every verb reaches the other ranks too
                message = leader.command(message)
            kind = message[0]
            if kind == "add":
                core.add(message[1])
            elif kind == "abort":
                core.abort(message[1])
            elif kind == "clear_prefix_cache":
                engine.clear_prefix_cache()
                outbox.send(("ok", None))
            elif kind == "close":
                return
        if core.broken:
            if not told_broken:
                _send(outbox, ("broken", None))
                told_broken = True
            continue
        if not core.has_unfinished:
            continue
        if leader is not None:
            leader.command(("step",))
        for output in core.step(interrupt=pressing):
            if isinstance(output, PartialResult):
                sent = _send(outbox, ("partial", output))
            else:
                if leader is not None:
                    output = leader.result(output)
                sent = _send(outbox, ("result", output))
            if not sent:
                raise SystemExit(0)  # the worker's end is closed


def _send(outbox: Any, message: tuple[Any, ...]) -> bool:
    """Send to the parent; False when its end is closed."""
    try:
        outbox.send(message)
    except OSError:
        return False
    return True
