"""Poison containment around an engine's `generate`: one request that makes it raise ends as
that request's error result, and the others go on.

When `generate` raises, the requests it had pulled and not answered are the suspects: each
runs again alone; one that raises alone ends with `internal_error`, the others complete. Then
generation resumes on the rest of the source. When every suspect (more than one) fails alone,
or the engine raises holding none, the engine itself is broken (`broken` is set) and the run
stops: whatever was not answered is left to the caller, who hands it back (its attempts are
bounded where it was claimed).

A streaming request whose partial text was already yielded is not streamed twice: its run
alone yields only the text past what was sent, and ends as `internal_error` if its text departs
from it (sampling drew other tokens), since text a client was streamed cannot be taken back.

The same holds for the engine core's verbs (`add`, `abort`, `step`), which the engine process
drives: a step that raises makes the requests in flight the suspects, each run alone within
that step; the requests waiting that never ran are queued again, untouched.

Used where the engine runs: the worker's inline pipeline, and the engine process (so a
request that kills a step is isolated there, next to the engine, not across the pipe).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Mapping
from typing import Any

from boardwalk.logs import exception_trace

from .protocol import GenerationEngine
from .types import (
    ERROR_INTERNAL,
    GenerationRequest,
    GenerationResult,
    PartialResult,
)

logger = logging.getLogger(__name__)


class Contained:
    """`generate` of `engine`, with the failures of single requests contained; itself a
    `GenerationEngine`."""

    contains_failures = True

    def __init__(
        self,
        engine: GenerationEngine,
        *,
        alone_aborted: Callable[[], Collection[str]] | None = None,
    ) -> None:
        """`alone_aborted`: what the runs alone of `step`'s suspects poll for aborts (the
        engine process: the aborts waiting in its pipe)."""
        self.engine = engine
        self.broken = False
        self._alone_aborted = alone_aborted
        self._lock = threading.Lock()
        self._turn = threading.Lock()  # one verb at a time on the engine
        self._knocks = 0  # verbs waiting for their turn
        self._in_engine: dict[str, GenerationRequest] = {}  # pulled, not answered
        self._streamed: dict[str, dict[int, str]] = {}  # partial text yielded, by choice

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def max_batch_size(self) -> int:
        return self.engine.max_batch_size

    @property
    def media_modalities(self) -> frozenset[str]:
        return self.engine.media_modalities

    def clear_prefix_cache(self) -> None:
        self.engine.clear_prefix_cache()

    # -- the verbs: an engine core (engine.py) with its failures contained -------------------
    # Safe from several threads (the worker's feed adds interactive requests while the run's
    # loop steps): one verb at a time on the engine, and a decoding run gives way to an `add`
    # or `abort` waiting for its turn.

    @property
    def credit(self) -> int:
        return self.engine.credit

    @property
    def has_unfinished(self) -> bool:
        return bool(self.engine.has_unfinished)

    def add(self, request: GenerationRequest) -> None:
        with self._lock:
            self._in_engine[request.id] = request
        with self._knocking():
            self.engine.add(request)

    def abort(self, request_ids: Collection[str]) -> None:
        """Their results (aborted) come out of the next `step`."""
        with self._knocking():
            self.engine.abort(request_ids)

    def step(
        self, *, wait: float = 0.0, interrupt: Callable[[], bool] | None = None
    ) -> list[GenerationResult | PartialResult]:
        """The engine's `step`; when it raises, the requests it had in flight run alone (see
        the module doc) and their results are this step's. Sets `broken` as `generate` does."""
        engine: Any = self.engine
        knocked = None
        if interrupt is not None:

            def knocked() -> bool:
                return self._knocks > 0 or interrupt()

        with self._turn:
            try:
                outputs: list[GenerationResult | PartialResult] = engine.step(
                    wait=wait, interrupt=knocked
                )
            except Exception as exc:
                logger.error("engine step failed, isolating its requests: %s", exception_trace(exc))
                return self._isolate(engine.reset())
        for output in outputs:
            self._note(output)
        return outputs

    @contextlib.contextmanager
    def _knocking(self) -> Iterator[None]:
        with self._lock:
            self._knocks += 1
        try:
            with self._turn:
                yield
        finally:
            with self._lock:
                self._knocks -= 1

    def _isolate(
        self, unstarted: list[GenerationRequest]
    ) -> list[GenerationResult | PartialResult]:
        """After a step raised and the engine was reset: the suspects (every request added and
        not answered, less `unstarted`, which never ran) run alone; `unstarted` is queued
        again unless the engine is found broken."""
        waiting = {r.id for r in unstarted}
        with self._lock:
            suspects = [r for r in self._in_engine.values() if r.id not in waiting]
            for request in suspects:
                del self._in_engine[request.id]
            streamed = {r.id: self._streamed.pop(r.id, None) for r in suspects}
        outputs: list[GenerationResult | PartialResult] = []
        if not suspects:
            self.broken = True  # it raised with nothing in flight: no request is to blame
            return outputs
        outputs.extend(self._alone_each(suspects, streamed, self._alone_aborted))
        if self.broken:
            return outputs
        for request in unstarted:
            self.engine.add(request)  # type: ignore[attr-defined]
        return outputs

    # -- the pull loop ------------------------------------------------------------------------

    def generate(
        self,
        source: Iterable[GenerationRequest],
        *,
        aborted: Callable[[], Collection[str]] | None = None,
    ) -> Iterator[GenerationResult | PartialResult]:
        def tracked() -> Iterator[GenerationRequest]:
            for request in source:
                with self._lock:
                    self._in_engine[request.id] = request
                yield request

        feed = tracked()
        while True:
            try:
                for result in self.engine.generate(feed, aborted=aborted):
                    self._note(result)
                    yield result
                return
            except Exception as exc:
                logger.error("engine failed, isolating its requests: %s", exception_trace(exc))
                with self._lock:
                    suspects = list(self._in_engine.values())
                    self._in_engine.clear()
                    streamed, self._streamed = self._streamed, {}
                if not suspects:
                    # It raised holding no request of the source's: no request is to blame,
                    # and calling it again would fail the same way, for ever.
                    self.broken = True
                    return
                yield from self._alone_each(suspects, streamed, aborted)
                if self.broken:
                    return

    def _alone_each(
        self,
        suspects: list[GenerationRequest],
        streamed: Mapping[str, dict[int, str] | None],
        aborted: Callable[[], Collection[str]] | None,
    ) -> Iterator[GenerationResult | PartialResult]:
        """Each suspect run alone: its outputs, or its internal_error when it raises alone.
        Sets `broken` when each of several suspects fails alone: not one request, the
        engine itself is broken."""
        failures = 0
        for request in suspects:
            try:
                yield from _alone(self.engine, request, streamed.get(request.id), aborted)
            except Exception as alone:
                failures += 1
                logger.error(
                    "request %s fails alone, internal_error: %s",
                    request.id.split(":")[0],
                    exception_trace(alone),
                )
                yield failed_result(request)
        if len(suspects) > 1 and failures == len(suspects):
            self.broken = True

    def _note(self, result: GenerationResult | PartialResult) -> None:
        with self._lock:
            if isinstance(result, PartialResult):
                sent = self._streamed.setdefault(result.id, {})
                sent[result.index] = sent.get(result.index, "") + result.text
            else:  # answered: nothing of it is a suspect any more
                self._in_engine.pop(result.id, None)
                self._streamed.pop(result.id, None)


def _alone(
    engine: GenerationEngine,
    request: GenerationRequest,
    sent: dict[int, str] | None,
    aborted: Callable[[], Collection[str]] | None,
) -> Iterator[GenerationResult | PartialResult]:
    """`request` run alone again. With `sent` (its partial text already yielded, by choice),
    the run's partials yield only the text past it, and a run whose text departs from it
    ends as the request's internal_error."""
    if not sent:
        yield from engine.generate([request], aborted=aborted)
        return
    again: dict[int, str] = {}
    run = iter(engine.generate([request], aborted=aborted))
    try:
        for result in run:
            if isinstance(result, PartialResult):
                before = again.get(result.index, "")
                text = again[result.index] = before + result.text
                done = sent.get(result.index, "")
                if not (text.startswith(done) or done.startswith(text)):
                    yield failed_result(request)
                    return
                if len(text) > len(done):
                    yield PartialResult(
                        result.id, result.index, text[max(len(done), len(before)) :]
                    )
                continue
            if not all(c.text.startswith(sent.get(c.index, "")) for c in result.choices):
                result = failed_result(request)
            yield result
    finally:
        if isinstance(run, Generator):
            run.close()  # a run left early frees its rows now


def failed_result(request: GenerationRequest) -> GenerationResult:
    return GenerationResult(
        id=request.id,
        choices=[],
        prompt_tokens=len(request.prompt_ids),
        completion_tokens=0,
        cached_tokens=0,
        busy_seconds=0.0,
        error=ERROR_INTERNAL,
    )
