"""Watching an engine's steps in tests: what each step's plan held, as the runner received it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from inference.engine import Engine


@contextmanager
def steps_of(engine: Engine, summary: Callable[[Any], Any]) -> Iterator[list[Any]]:
    """`summary(work)` of every step the engine runs inside the block, in order (the work is
    read before the forward, so a sequence's `computed` is what it had before the step)."""
    seen: list[Any] = []
    run = engine._runner.run

    def recorded(work, failed):
        seen.append(summary(work))
        return run(work, failed)

    engine._runner.run = recorded  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del engine._runner.run
