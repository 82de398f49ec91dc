"""A stand-in engine whose steps take a fixed time: for scheduler and scale benchmarks.

It keeps the real engine's contract (the verbs `add`, `abort`, `step`, safe across threads;
continuous batching up to `max_batch_size` rows, interactive requests first; results as they
finish, busy-time shares; `generate` a loop over the verbs) but each step sleeps instead of
running a model, so a benchmark built on it measures coordination — claims, leases, records — rather
than the CPU. It always generates exactly `max_new_tokens` (token id 0, text "ok ") per
choice, and a streaming request's choices yield each step's text as a `PartialResult`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from inference.engine.types import (
    ERROR_CONTEXT_LENGTH,
    FINISH_LENGTH,
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
        self._lock = threading.Lock()
        self._rows: dict[str, list[Any]] = {}
        self._outbox: list[GenerationResult | PartialResult] = []

    def clear_prefix_cache(self) -> None:
        """Nothing is cached."""

    # -- the verbs ---------------------------------------------------------------------------

    @property
    def credit(self) -> int:
        return self.max_batch_size

    @property
    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._rows or self._outbox)

    def add(self, request: GenerationRequest) -> None:
        with self._lock:
            if len(request.prompt_ids) + request.params.max_new_tokens > self.context_length:
                self._outbox.append(_result(request, 0, 0.0, error=ERROR_CONTEXT_LENGTH))
                return
            # id → [request, tokens so far, busy seconds]; interactive ones step first.
            self._rows[request.id] = [request, 0, 0.0]
            if request.priority > 0:
                self._rows = dict(sorted(self._rows.items(), key=lambda r: -r[1][0].priority))

    def abort(self, request_ids: Collection[str]) -> None:
        with self._lock:
            for rid in [rid for rid in self._rows if rid in request_ids]:
                request, made, busy = self._rows.pop(rid)
                self._outbox.append(_result(request, made, busy, aborted=True))

    def step(
        self, *, wait: float = 0.0, interrupt: Callable[[], bool] | None = None
    ) -> list[GenerationResult | PartialResult]:
        """One step: every row in flight (the first `max_batch_size` rows held) takes a
        token, after `step_seconds`."""
        with self._lock:
            outputs, self._outbox = self._outbox, []
            flight, rows = [], 0
            for rid, (request, _, _) in self._rows.items():
                if rows + request.params.n > self.max_batch_size:
                    break
                flight.append(rid)
                rows += request.params.n
        if not flight:
            return outputs
        time.sleep(self.step_seconds)
        self.busy_seconds_total += self.step_seconds
        share = self.step_seconds / len(flight)
        with self._lock:
            for rid in flight:
                row = self._rows.get(rid)
                if row is None:  # aborted during the step
                    continue
                row[1] += 1
                row[2] += share
                if row[0].stream:
                    for index in range(row[0].params.n):
                        outputs.append(PartialResult(rid, index, WORD))
                if row[1] >= row[0].params.max_new_tokens:
                    del self._rows[rid]
                    outputs.append(_result(row[0], row[1], row[2]))
        return outputs

    def generate(
        self,
        requests: Iterable[GenerationRequest],
        *,
        aborted: Callable[[], Collection[str]] | None = None,
    ) -> Iterator[GenerationResult | PartialResult]:
        source = iter(requests)
        exhausted = False
        since_poll = 0.0
        while True:
            while not exhausted and self._rows_held() < self.max_batch_size:
                request = next(source, None)
                if request is None:
                    exhausted = True
                    break
                self.add(request)
            if not self.has_unfinished:
                if exhausted:
                    return
                continue
            if aborted is not None and since_poll >= self.abort_poll_seconds:
                since_poll = 0.0
                self.abort(set(aborted()))
            yield from self.step()
            since_poll += self.step_seconds

    def _rows_held(self) -> int:
        with self._lock:
            return sum(r[0].params.n for r in self._rows.values())


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
