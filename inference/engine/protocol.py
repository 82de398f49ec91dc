"""What every generation engine offers the worker: the in-process `Engine` (engine.py), the
engine in a child process (`EngineProcess`, process.py), the containment wrapper
(`Contained`, containment.py) and the scale benchmarks' `FakeEngine`
(inference/demo/fake_engine.py).

The worker's pipeline (batches/execution/) reads these and nothing else, so it never has to
ask an engine what it is. No torch here: the web tier may import it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, Protocol

from .types import GenerationRequest, GenerationResult, PartialResult


class GenerationEngine(Protocol):
    @property
    def tokenizer(self) -> Any:
        """The revision's tokenizer, with its chat template (prepare renders with it)."""

    @property
    def max_batch_size(self) -> int:
        """Rows in flight at most (n per request)."""

    @property
    def media_modalities(self) -> frozenset[str]:
        """The media ("image", "audio") whose encoders the engine runs; empty for text only."""

    @property
    def contains_failures(self) -> bool:
        """Whether `generate` itself turns a request that makes it raise into that request's
        `internal_error` result (else the caller wraps it in `Contained`)."""

    @property
    def broken(self) -> bool:
        """Set when the engine as a whole failed: it is not to be used again."""

    def generate(
        self,
        requests: Iterable[GenerationRequest],
        /,
        *,
        aborted: Callable[[], Collection[str]] | None = None,
        urgent: Callable[[], bool] | None = None,
    ) -> Iterator[GenerationResult | PartialResult]:
        """Results as they finish, pulling requests lazily (they may yield NOT_READY);
        requests whose id `aborted()` returns end with aborted=True. Streaming requests
        (`stream=True`) also get a PartialResult per step with their new text. `urgent()`:
        whether the source's next request is interactive, which a full engine still pulls
        (it takes its row from a batch sequence)."""
        ...

    def clear_prefix_cache(self) -> None:
        """Forget the cached keys and values of finished requests (not during `generate`)."""
