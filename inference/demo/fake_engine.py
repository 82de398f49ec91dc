"""A stand-in engine whose steps take a fixed time: for scheduler and scale benchmarks.

It keeps the real engine's contract (continuous batching up to `max_batch_size`, results as
they finish, `aborted` polled, busy-time shares) but each step sleeps instead of running a
model, so a benchmark built on it measures coordination — claims, leases, records — rather
than the CPU. It always generates exactly `max_new_tokens` (token id 0, text "ok ") per
choice, and a streaming request's choices yield each step's text as a `PartialResult`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from inference.engine.types import (
    ERROR_CONTEXT_LENGTH,
    FINISH_LENGTH,
    NOT_READY,
    Choice,
    GenerationRequest,
    GenerationResult,
    PartialResult,
)

WORD = "ok "  # what each generated token reads as


class FakeEngine:
    """A `GenerationEngine` (inference/engine/protocol.py) for text rows."""

    media_modalities: frozenset[str] = frozenset()
    contains_failures = False
    broken = False

    def __init__(
        self,
        tokenizer: Any,
        *,
        context_length: int,
        max_batch_size: int = 32,
        step_seconds: float = 0.01,
        abort_poll_seconds: float = 0.5,
    ) -> None:
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.max_batch_size = max_batch_size
        self.step_seconds = step_seconds
        self.abort_poll_seconds = abort_poll_seconds
        self.busy_seconds_total = 0.0

    def clear_prefix_cache(self) -> None:
        """Nothing is cached."""

    def generate(
        self,
        requests: Iterable[GenerationRequest],
        *,
        aborted: Callable[[], Collection[str]] | None = None,
        urgent: Callable[[], bool] | None = None,  # a fake has no rows to give up: ignored
    ) -> Iterator[GenerationResult | PartialResult]:
        source = iter(requests)
        rows: dict[str, list[Any]] = {}  # id → [request, tokens so far, busy seconds]
        exhausted = False
        since_poll = 0.0
        while True:
            while not exhausted and sum(r[0].params.n for r in rows.values()) < self.max_batch_size:
                request = next(source, None)
                if request is None:
                    exhausted = True
                    break
                if request is NOT_READY:
                    break
                if len(request.prompt_ids) + request.params.max_new_tokens > self.context_length:
                    yield _result(request, 0, 0.0, error=ERROR_CONTEXT_LENGTH)
                    continue
                rows[request.id] = [request, 0, 0.0]
            if not rows:
                if exhausted:
                    return
                continue
            if aborted is not None and since_poll >= self.abort_poll_seconds:
                since_poll = 0.0
                stop = set(aborted())
                for rid in [rid for rid in rows if rid in stop]:
                    request, made, busy = rows.pop(rid)
                    yield _result(request, made, busy, aborted=True)
            time.sleep(self.step_seconds)
            since_poll += self.step_seconds
            self.busy_seconds_total += self.step_seconds
            share = self.step_seconds / max(1, len(rows))
            for rid in list(rows):
                row = rows[rid]
                row[1] += 1
                row[2] += share
                if row[0].stream:
                    for index in range(row[0].params.n):
                        yield PartialResult(rid, index, WORD)
                if row[1] >= row[0].params.max_new_tokens:
                    del rows[rid]
                    yield _result(row[0], row[1], row[2])


def _result(
    request: GenerationRequest,
    made: int,
    busy: float,
    *,
    aborted: bool = False,
    error: str | None = None,
) -> GenerationResult:
    choices = []
    if not aborted and not error:
        choices = [
            Choice(index=i, token_ids=[0] * made, text=WORD * made, finish_reason=FINISH_LENGTH)
            for i in range(request.params.n)
        ]
    return GenerationResult(
        id=request.id,
        choices=choices,
        prompt_tokens=len(request.prompt_ids),
        # An aborted request reports what it generated before it stopped (it is billed).
        completion_tokens=0 if error else made * request.params.n,
        cached_tokens=0,
        busy_seconds=busy,
        aborted=aborted,
        error=error,
    )
