"""Poison containment around an engine's `generate`: one request that makes it raise ends as
that request's error result, and the others go on.

When `generate` raises, the requests it had pulled and not answered are the suspects: each
runs again alone; one that raises alone ends with `internal_error`, the others complete. Then
generation resumes on the rest of the source. When every suspect (more than one) fails alone,
or the engine raises holding none, the engine itself is broken (`broken` is set) and the run
stops: whatever was not answered is left to the caller, who hands it back (its attempts are
bounded where it was claimed).

Used where the engine runs: the worker's inline pipeline, and the engine process (so a
request that kills a step is isolated there, next to the engine, not across the pipe).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from .protocol import GenerationEngine
from .types import (
    ERROR_INTERNAL,
    NOT_READY,
    GenerationRequest,
    GenerationResult,
    PartialResult,
)

logger = logging.getLogger(__name__)


class Contained:
    """`generate` of `engine`, with the failures of single requests contained; itself a
    `GenerationEngine`."""

    contains_failures = True

    def __init__(self, engine: GenerationEngine) -> None:
        self.engine = engine
        self.broken = False
        self._lock = threading.Lock()
        self._in_engine: dict[str, GenerationRequest] = {}  # pulled, not answered

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

    def holding(self) -> bool:
        """Whether the engine holds a request it has not answered (pulled, no result yet)."""
        with self._lock:
            return bool(self._in_engine)

    def generate(
        self,
        source: Iterable[GenerationRequest],
        *,
        aborted: Callable[[], Collection[str]] | None = None,
        urgent: Callable[[], bool] | None = None,
    ) -> Iterator[GenerationResult | PartialResult]:
        def tracked() -> Iterator[GenerationRequest]:
            for request in source:
                if request is not NOT_READY:
                    with self._lock:
                        self._in_engine[request.id] = request
                yield request

        feed = tracked()
        while True:
            try:
                for result in self._generate(feed, aborted, urgent):
                    if isinstance(result, GenerationResult):  # a partial answers nothing
                        with self._lock:
                            self._in_engine.pop(result.id, None)
                    yield result
                return
            except Exception as exc:
                logger.error("engine failed (%s); isolating its requests", type(exc).__name__)
                with self._lock:
                    suspects = list(self._in_engine.values())
                    self._in_engine.clear()
                if not suspects:
                    # It raised holding no request of the source's: no request is to blame,
                    # and calling it again would fail the same way, for ever.
                    self.broken = True
                    return
                failures = 0
                for request in suspects:
                    try:
                        yield from self.engine.generate([request], aborted=aborted)
                    except Exception as alone:
                        failures += 1
                        logger.error(
                            "request %s fails alone (%s): internal_error",
                            request.id.split(":")[0],
                            type(alone).__name__,
                        )
                        yield failed_result(request)
                if len(suspects) > 1 and failures == len(suspects):
                    # Not one request: the engine itself is broken.
                    self.broken = True
                    return

    def _generate(
        self,
        feed: Iterable[GenerationRequest],
        aborted: Callable[[], Collection[str]] | None,
        urgent: Callable[[], bool] | None,
    ) -> Iterator[GenerationResult | PartialResult]:
        """`urgent` reaches only an engine that takes it (the in-process and child ones)."""
        generate: Any = self.engine.generate
        if urgent is None:
            return generate(feed, aborted=aborted)  # type: ignore[no-any-return]
        return generate(feed, aborted=aborted, urgent=urgent)  # type: ignore[no-any-return]


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
