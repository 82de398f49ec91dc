"""Taking the engine's steps: one step, or a decoding run of several.

A single step asks the scheduler for its work, runs the forward (runner.py; out of memory
halves the step and tries again), samples each row's next token and appends it (outputs.py),
taking the sequences that finished out of flight. A decoding run (runs.py) takes its steps on
the device and is recorded once it ends: the steps before the last in bulk, the last as a
single step's. The engine (engine.py) chooses which, and turns what either returns into its
outputs and busy shares.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .decoding import TextDecoder
from .outputs import advance
from .runner import ModelRunner
from .runs import DecodeRun
from .scheduler import Scheduler
from .sequence import Failed, Sequence

# What a step or run returns: the sequences that took part, those that took a token and go
# on, those that finished, and the requests that failed (already out of flight).
Stepped = tuple[list[Sequence], list[Sequence], list[Sequence], Failed]


class Stepper:
    """Takes the steps of one engine's scheduler with its runner."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        *,
        eos_token_ids: frozenset[int],
        decoder: TextDecoder,
    ) -> None:
        self._scheduler = scheduler
        self._runner = runner
        self._eos_token_ids = eos_token_ids
        self._decoder = decoder

    def step(self) -> Stepped:
        """Schedule, run and sample one step."""
        scheduler = self._scheduler
        failed = Failed()
        while True:
            work = scheduler.schedule()
            try:
                logits = self._runner.run(work, failed)
                break
            except torch.OutOfMemoryError:
                if not scheduler.shrink(work):
                    for seq, _ in work:
                        failed.add(seq.owner)
                    scheduler.drop(failed.owners)
                    return [s for s, _ in work], [], [], failed
                self._runner.release_memory()

        stepped = [seq for seq, _ in work]
        sampled, rows = scheduler.computed(work, logits.ok, failed)
        scheduler.drop(failed.owners)
        if failed.owners:
            keep = [i for i, seq in enumerate(sampled) if seq.owner not in failed.owners]
            sampled, rows = [sampled[i] for i in keep], [rows[i] for i in keep]
        if not sampled or logits.values is None:
            return stepped, [], [], failed
        values = logits.values
        if len(rows) != len(work) or rows != list(range(len(work))):
            values = values[torch.tensor(rows, dtype=torch.long).to(values.device)]
        tokens = self._runner.next_tokens(values, sampled, failed)
        return (stepped, *self._sampled(sampled, tokens, failed))

    def run(self, run: DecodeRun, *, stop: Callable[[], bool]) -> Stepped:
        """Take a run's steps until it ends (runs.py: `DecodeRun.take`). Then the steps before
        the last are recorded in bulk (no row can end in them) and the last as a single step's
        are. A step that raises ends the run before it: the next single step runs it again,
        and finds the request it belongs to there (runner.run)."""
        taken = run.take(self._eos_token_ids, stop=stop)
        if not taken:
            return self.step()
        failed = Failed()
        seqs = run.seqs
        if taken > 1:
            for seq, column in zip(seqs, zip(*run.tokens[:-1], strict=True), strict=True):
                seq.tokens.extend(column)
                seq.computed += taken - 1
        sampled, _ = self._scheduler.computed(
            [(seq, 1) for seq in seqs], [True] * len(seqs), failed
        )
        last: list[int | None] = list(run.tokens[-1])
        return (seqs, *self._sampled(sampled, last, failed))

    def _sampled(
        self, sampled: list[Sequence], tokens: list[int | None], failed: Failed
    ) -> tuple[list[Sequence], list[Sequence], Failed]:
        """Append the sampled tokens and take the sequences that finished out of flight;
        returns those that go on with a new token, those that finished, and `failed`."""
        scheduler = self._scheduler
        finished = advance(
            sampled, tokens, failed, eos_token_ids=self._eos_token_ids, decoder=self._decoder
        )
        scheduler.finish(finished)
        scheduler.drop(failed.owners)
        done = set(map(id, finished))
        advanced = [
            s
            for s, t in zip(sampled, tokens, strict=True)
            if t is not None and id(s) not in done and s.owner not in failed.owners
        ]
        return advanced, finished, failed
