"""Poison containment around an engine's generate (inference/engine/containment.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from inference.engine.containment import Contained
from inference.engine.types import GenerationRequest, SamplingParams


class _Refusing:
    """An engine whose generate raises before it pulls anything (a wrong signature, say)."""

    tokenizer = None
    max_batch_size = 4
    media_modalities: frozenset[str] = frozenset()
    contains_failures = False
    broken = False
    calls = 0

    def generate(self, requests: Any, *, aborted: Any = None) -> Iterator[Any]:
        self.calls += 1
        raise TypeError("generate() got an unexpected keyword argument")

    def clear_prefix_cache(self) -> None:
        pass


def test_an_engine_that_raises_holding_no_request_is_broken_not_called_for_ever():
    engine = _Refusing()
    contained = Contained(engine)  # type: ignore[arg-type]
    request = GenerationRequest("r1", [1, 2, 3], SamplingParams(max_new_tokens=2))
    assert list(contained.generate(iter([request]))) == []
    assert contained.broken
    assert engine.calls == 1
