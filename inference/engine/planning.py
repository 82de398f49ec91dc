"""The plan of each step: which sequences compute how many tokens (a part of the `Scheduler`).

Every step has a budget of rows and tokens: one token for each decoding sequence, oldest first
(the youngest holder of blocks preempted when their new blocks do not fit: its blocks go back,
its tokens stay, and it is computed again later, mostly from the prefix cache), then pieces of
prompts, oldest first (chunked prefill). Out of memory in a forward halves the budget until the
scheduler starts afresh.

Fresh batch prompts are started together: a prompt piece runs as a forward of its own beside
the decoding rows, and on a CPU that forward costs about as much for one short prompt as for
several, so while rows are decoding a batch sequence that has computed nothing yet waits until
an eighth of the rows are such sequences, or for at most `GATHER_STEPS` steps.

In each step interactive prompts take the token budget before batch prompts, and a step that
prefills an interactive prompt carries no batch prompt, so the first token of an interactive
request never waits behind a long batch prefill; the batch work beside interactive requests is
capped by the pacer (pacing.py). In steady decoding the plan of several steps is known at once
(`run_ahead`, `reserve`: a decoding run, runs.py).

`StepPlanning` is the `Scheduler`'s planning half (scheduler.py has admission, the queue and
the record of what each step computed): it reads the requests in flight and waiting, and the
plan's state that the scheduler sets when it starts afresh.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from .blocks import BlockManager
from .pacing import UNLIMITED, BatchAllowance, BatchPacer
from .sequence import Request, Sequence, Work, age, rows_held

logger = logging.getLogger(__name__)

# While rows are decoding, fresh batch prompts wait at most this many steps for company.
GATHER_STEPS = 4


class StepPlanning:
    """The plan of each step, a part of `Scheduler` (scheduler.py)."""

    # The requests and memory, set by the scheduler.
    blocks: BlockManager
    max_batch_size: int
    running: list[Sequence]
    waiting: deque[Request]
    holding_interactive: Callable[[], bool]
    # The plan's state, set afresh by the scheduler's `_start` (what each is: there).
    _pacer: BatchPacer | None
    _clock: Callable[[], float]
    _gather_rows: int
    _step_rows: int
    _step_tokens: int
    _gathering: int
    _seen_interactive: bool
    last_paced: tuple[int, int] | None

    def schedule(self) -> Work:
        """Pick (sequence, tokens to compute) for this step, reserving their blocks."""
        running = self.running
        budget = self._step_tokens
        limit = self._step_rows
        # Decoding sequences first (one token each), oldest first; preempt the youngest when
        # their new blocks do not fit.
        decoding = [s for s in running if s.prompt_length + len(s.tokens) - s.computed == 1]
        if len(decoding) > min(budget, limit):  # interactive rows are never the ones left out
            decoding.sort(key=lambda s: -s.owner.priority)
            del decoding[min(budget, limit) :]
        allow, prefill = UNLIMITED, False
        if self._pacer is not None and self._seen_interactive:
            allow, prefill = self._batch_allowance(self._pacer, decoding)
        if allow.rows is not None:
            decoding = _paced(decoding, allow.rows)
        while True:
            short = self.blocks.needed_decoding(decoding) - self.blocks.available
            if short <= 0:
                break
            victim = self._youngest_holder()
            if victim is None or (victim in decoding and len(decoding) == 1):
                break
            self._preempt(victim)
            if victim in decoding:
                decoding.remove(victim)
        work: Work = [(seq, 1) for seq in self.blocks.grow_decoding(decoding)]
        rows = len(work)
        budget -= rows
        deferred = False
        batch_tokens = allow.tokens  # (its floors keep batch advancing: pacing.py)
        if len(decoding) < len(running):  # some sequence has a prompt (piece) to compute
            wait = self.blocks.prefix_cache
            deferred = self._schedule_prompts(
                work, budget, limit, wait=wait, batch=batch_tokens, gather=self._gather(work)
            )
        if not work and deferred:
            # Waiting for a block that cannot be computed now (memory) would stall everyone.
            self._schedule_prompts(work, budget, limit, wait=False, batch=batch_tokens)
        if not work:
            # Every sequence is waiting for memory: free the youngest and go on with the rest.
            victim = self._youngest_holder()
            if victim is not None and victim is not min(running, key=age):
                self._preempt(victim)
                return self.schedule()
            raise RuntimeError("no sequence can be scheduled")  # cannot happen: see refusal
        self.last_paced = None
        if allow.limited and not prefill:
            batch = [(s, t) for s, t in work if s.owner.priority <= 0]
            self.last_paced = (
                sum(1 for _, t in batch if t == 1),
                sum(t for _, t in batch if t > 1),
            )
        return work

    def run_ahead(self, max_steps: int) -> tuple[list[Sequence], int] | None:
        """The sequences and number of steps of a decoding run (runs.py), when the next steps'
        plan is known already: nothing waits that a step could admit (no interactive
        request, and no row free for a batch one), every sequence in flight is a batch sequence
        decoding with sampling that can run ahead (`Sequence.runs_ahead`), the step budget
        and pacing take them all, and every one can take the run's steps without reaching
        its `max_new_tokens` before the last. None otherwise (steps go one at a time).
        Reserves nothing: `reserve` does."""
        running = self.running
        if not running or len(running) > min(self._step_rows, self._step_tokens):
            return None
        if self.waiting and (
            rows_held(running) < self.max_batch_size or self.holding_interactive()
        ):
            return None
        steps = max_steps
        for seq in running:
            if (
                not seq.runs_ahead
                or not seq.owner.forked
                or seq.computed == 0
                or seq.prompt_length + len(seq.tokens) - seq.computed != 1
            ):
                return None
            steps = min(steps, seq.owner.spec.params.max_new_tokens - len(seq.tokens))
        if steps < 2:
            return None
        if self._pacer is not None and self._seen_interactive:
            allow = self._pacer.allowance(interactive=0, prefill=False, now=self._clock())
            if allow.limited:
                return None
        self.last_paced = None
        return list(running), steps

    def reserve(self, seqs: list[Sequence], steps: int) -> int:
        """Reserve the blocks of `steps` more tokens for each sequence, or of half as many
        while they do not all fit now; returns the steps reserved (0: nothing, fewer than
        two would fit)."""
        blocks = self.blocks
        while steps >= 2:
            if sum(blocks.needed(seq, steps) for seq in seqs) <= blocks.available:
                for seq in seqs:
                    blocks.grow(seq, steps)
                return steps
            steps //= 2
        return 0

    def _gather(self, work: Work) -> bool:
        """Whether fresh batch prompts wait this step (rows are decoding, too few of them are
        fresh yet, and they have not waited GATHER_STEPS already)."""
        if not work or self._gather_rows <= 1:
            return False
        fresh = sum(1 for s in self.running if s.computed == 0 and s.owner.priority <= 0)
        if 0 < fresh < self._gather_rows and self._gathering < GATHER_STEPS:
            self._gathering += 1
            return True
        self._gathering = 0
        return False

    def _batch_allowance(
        self, pacer: BatchPacer, decoding: list[Sequence]
    ) -> tuple[BatchAllowance, bool]:
        """What batch work may join a step beside the interactive work in flight (pacing.py),
        and whether the step prefills an interactive prompt."""
        decoding_interactive = sum(1 for s in decoding if s.owner.priority > 0)
        prefill = any(s.owner.priority > 0 and s.length - s.computed > 1 for s in self.running)
        allow = pacer.allowance(
            interactive=max(decoding_interactive, int(prefill)),
            prefill=prefill,
            now=self._clock(),
        )
        return allow, prefill

    def _schedule_prompts(
        self,
        work: Work,
        budget: int,
        limit: int,
        *,
        wait: bool,
        batch: int | None = None,
        gather: bool = False,
    ) -> bool:
        """Add pieces of prompts to `work`, oldest first; returns whether a sequence waited.
        `batch`: at most this many tokens of batch prompts (None: the budget's); `gather`:
        batch sequences that have computed nothing yet wait (their prompts start together).

        With `wait`, a sequence whose next block is one an older sequence has still to compute
        skips the step and reads that block from the cache once it is there: a prefix shared
        by many rows admitted together is computed once, not once per row.
        """
        bs = self.blocks.block_size
        coming: set[bytes] = set()
        deferred = False
        interactive = False  # an interactive prompt is in this step: no batch prompt joins it
        for seq in sorted(self.running, key=age):
            if budget <= 0 or len(work) >= limit:
                break
            if seq.length - seq.computed <= 1:
                continue
            if seq.owner.priority <= 0 and (interactive or batch == 0):
                break  # (sorted: every later one is batch too)
            if gather and seq.computed == 0 and seq.owner.priority <= 0:
                continue
            self.blocks.reuse_cached(seq)
            if wait:
                pending = seq.prompt_digests[seq.computed // bs :]
                if pending and seq.computed % bs == 0 and pending[0] in coming:
                    deferred = True
                    continue
                coming.update(pending)
            cap = budget if batch is None or seq.owner.priority > 0 else min(budget, batch)
            take = self.blocks.grow(seq, min(seq.length - seq.computed, cap))
            if take:
                work.append((seq, take))
                budget -= take
                if seq.owner.priority > 0:
                    interactive = True
                elif batch is not None:
                    batch -= take
        return deferred

    def shrink(self, work: Work) -> bool:
        """After `work` ran out of memory: halve the step's rows and tokens until `reset` (the
        rest of the `generate` call). False when it was a single token already (nothing
        smaller to try)."""
        if len(work) <= 1 and sum(t for _, t in work) <= 1:
            return False
        logger.warning("out of memory in a step of %d sequences; halving", len(work))
        self._step_rows = max(1, len(work) // 2)
        self._step_tokens = max(1, sum(t for _, t in work) // 2)
        return True

    # -- preemption (parking, in scheduler.py, preempts too) -------------------------------

    def _youngest_holder(self) -> Sequence | None:
        holders = [s for s in self.running if s.blocks]
        return max(holders, key=age) if holders else None

    def _preempt(self, seq: Sequence) -> None:
        """Give a sequence's blocks back; it keeps its tokens and is recomputed later."""
        self.blocks.reset(seq)
        seq.preempted = True


def _paced(decoding: list[Sequence], batch_rows: int) -> list[Sequence]:
    """The decoding rows less the batch ones past the first `batch_rows` (oldest first)."""
    kept: list[Sequence] = []
    for seq in decoding:
        if seq.owner.priority > 0:
            kept.append(seq)
        elif batch_rows > 0:
            kept.append(seq)
            batch_rows -= 1
    return kept
