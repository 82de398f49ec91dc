"""Decoding runs: several decoding steps of the same rows, planned at once.

In steady decoding (every sequence in flight decoding, nothing waiting, no interactive
request) the plan of the next steps is known before they run: the same rows, one token each.
A run reserves each row's blocks for up to `MAX_RUN_STEPS` tokens at once and gathers their
block tables once; each of its steps is then tensor work alone: the tokens one step samples
are the next step's inputs where they already are (on the device), the lengths step by one,
the bans and draws of its sampling were prepared for the whole run (sampling.RunSampler), and
the only read into Python is the sampled tokens, as in a single step. What a step costs in
Python per row (appending the token, sealing full blocks, finishing) is done once for the run
when it ends (stepping.py). Here: planning a run (`plan_run`), its steps, and taking them until
it ends (`DecodeRun.take`).

A run ends at its last step, at the first step in which a row samples an end-of-sequence token
(its steps are chosen so that no row reaches its `max_new_tokens` before the last), and when
the engine must look at what came for it (its caller's `interrupt()`: an interactive
request, an abort, a batch request with a row free) or the abort poll is due: the engine's
`stop()`, which on a tensor-parallel engine is the leader's answer (lockstep.py). The steps a
run takes are the steps the engine would have taken one at a time, with the same layout and
shapes: the same tokens (tests/inference/test_engine_runs.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch

from boardwalk.logs import exception_trace

from .runner import ModelRunner
from .sampling import RunSampler
from .scheduler import Scheduler
from .sequence import Sequence

logger = logging.getLogger(__name__)

# The most steps planned at once: a row's reservation is then at most one block ahead.
MAX_RUN_STEPS = 32


def plan_run(scheduler: Scheduler, runner: ModelRunner) -> DecodeRun | None:
    """A decoding run over every sequence in flight, when the next steps' plan is known
    and their blocks fit."""
    planned = scheduler.run_ahead(MAX_RUN_STEPS)
    if planned is None:
        return None
    seqs, steps = planned
    if not runner.decodes_padded(seqs):
        return None
    steps = scheduler.reserve(seqs, steps)
    return DecodeRun(runner, seqs, steps) if steps else None


class DecodeRun:
    """The steps of one run over `seqs` (their blocks reserved for `steps` tokens)."""

    def __init__(self, runner: ModelRunner, seqs: list[Sequence], steps: int) -> None:
        device, bs = runner.device, runner.block_size
        self.seqs = seqs
        self.steps = steps
        self.tokens: list[list[int]] = []  # each step's sampled tokens, a row per sequence
        self._runner = runner
        # The longest row's length after the first step: step i's table is as wide as
        # a single step's would be (the same shapes, so the same logits).
        self._first = max(seq.computed for seq in seqs) + 1
        self._block_size = bs
        self._table = runner.pool.tables.gather(seqs, math.ceil((self._first + steps - 1) / bs))
        self._layouts = runner.decode_layouts(self._table)
        self._lengths = _to([seq.computed + 1 for seq in seqs], device)
        self._ids = _to([[seq.token_at(seq.computed)] for seq in seqs], device)
        self._sampler = RunSampler([seq.sampling for seq in seqs], steps, device)

    def step(self) -> list[int]:
        """Run the next step; its tokens, a row per sequence."""
        step = len(self.tokens)
        width = -(-(self._first + step) // self._block_size)
        logits = self._runner.decode(
            self._ids, self._table[:, :width], self._lengths + step, self._layouts
        )
        chosen = self._sampler.choose(logits, step)
        tokens: list[int] = chosen.tolist()
        self._ids = chosen[:, None]
        self.tokens.append(tokens)
        return tokens

    def take(self, eos: frozenset[int], *, stop: Callable[[], bool]) -> int:
        """Take the steps until the run ends: its last step, a row's end-of-sequence token
        (in `eos`), or `stop()` after a step (something new came for the engine, or the
        caller's time is up); returns the steps taken. A step that raises ends the run before
        it (the engine's next single step runs it again)."""
        try:
            while len(self.tokens) < self.steps:
                tokens = self.step()
                if not eos.isdisjoint(tokens) or stop():
                    break
        except Exception as exc:  # OutOfMemoryError included: the single step halves
            logger.warning("a decoding run stopped: %s", exception_trace(exc))
            self._runner.release_memory()
        finally:
            self.end()
        return len(self.tokens)

    def end(self) -> None:
        """No more steps: the sampling rows' generators are left as the steps taken left them."""
        self._sampler.rewind(len(self.tokens))


def _to(values: list, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)
