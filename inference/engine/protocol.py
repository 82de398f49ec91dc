"""What every generation engine offers the worker: the in-process `Engine` (engine.py), the
engine in a child process (`EngineProcess`, process.py), the containment wrapper
(`Contained`, containment.py), the scale benchmarks' `FakeEngine`
(inference/demo/fake_engine.py), and `ExternalEngine` (inference/external/engine.py), whose
rows an OpenAI-compatible server answers.

The worker's pipeline (batches/execution/) reads these and nothing else, so it never has to
ask an engine what it is. Its run drives the verbs (`add`, `abort`, `step`), as vLLM's engine
core is driven; `generate` is a loop over them for callers that pull from a list. No torch
here: the web tier may import it.
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

    @property
    def credit(self) -> int:
        """Requests to add ahead of their results (interactive ones go past it): the rows, or
        more for an engine in another process, so that ready requests wait where it steps."""

    @property
    def has_unfinished(self) -> bool:
        """Whether a request added has no result yet (or one waits for the next `step`)."""

    def add(self, request: GenerationRequest) -> None:
        """Queue a request; its result comes out of a later `step`. Interactive requests
        (priority > 0) go ahead of batch ones. Safe from another thread than `step`'s."""

    def abort(self, request_ids: Collection[str]) -> None:
        """Stop the requests held with these ids; their results (aborted=True) come out of a
        later `step`. Ids not held are ignored."""

    def step(
        self, *, wait: float = 0.0, interrupt: Callable[[], bool] | None = None
    ) -> list[GenerationResult | PartialResult]:
        """Outputs since the last step: partial texts of streaming requests, results and
        refusals. An engine in this process runs a step for them (given `interrupt`, maybe a
        decoding run of several, ended when `interrupt()` says something new came); one in
        another process waits up to `wait` seconds for what it sends."""
        ...

    def generate(
        self,
        requests: Iterable[GenerationRequest],
        /,
        *,
        aborted: Callable[[], Collection[str]] | None = None,
    ) -> Iterator[GenerationResult | PartialResult]:
        """A loop over the verbs: results as they finish, pulling requests from `requests`
        as room frees up; requests whose id `aborted()` returns end with aborted=True.
        Streaming requests (`stream=True`) also get a PartialResult per step with their new
        text."""
        ...

    def clear_prefix_cache(self) -> None:
        """Forget the cached keys and values of finished requests (while nothing is held)."""
