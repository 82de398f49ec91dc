"""The scheduler: admission, the queue, preemption and what each step computed (one per
engine, started afresh whenever it holds nothing, and `reset` when a `generate` call ends).

Requests wait until a row is free and the memory left (blocks.py) covers their prompt plus
what the sequences in flight still have to compute; then their first choice is in flight, and
the other n - 1 are forked from it once its prompt is prefilled, sharing its blocks. The plan
of each step (its budget, decoding rows, prompt pieces, pacing and decoding runs) is the
scheduler's other half, `StepPlanning` (planning.py), which `Scheduler` extends.

Two classes: requests of priority > 0 (interactive) wait ahead of batch requests, are admitted
first, and when no row or not enough memory is free they take them from running batch
requests, youngest first: those are parked (their blocks go back, their tokens and sampling
state stay) and admitted again, ahead of new batch requests, once rows free up, computed again
mostly from the prefix cache as after any preemption. An interactive sequence is never
preempted for a batch one. Without interactive requests nothing of this runs: batch is
scheduled as it always was.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Collection

from boardwalk.logs import exception_trace

from .blocks import BlockManager
from .pacing import BatchPacer
from .planning import StepPlanning
from .sequence import Failed, Request, Sequence, Work, rows_held
from .types import ERROR_CONTEXT_LENGTH, ERROR_INVALID_REQUEST, GenerationRequest

logger = logging.getLogger(__name__)


class Scheduler(StepPlanning):
    def __init__(
        self,
        blocks: BlockManager,
        *,
        max_batch_size: int,
        max_step_tokens: int,
        context_length: int,
        vocab_size: int,
        media_modalities: Collection[str],
        new_sequence: Callable[[Request, int], Sequence],
        pacer: BatchPacer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`new_sequence(request, choice)`: a fresh sequence (its sampling state) for a choice.
        `pacer`: the engine's caps on batch work beside interactive requests (pacing.py);
        without it batch is never held back. `clock`: the pacer's time (the leader's on a
        tensor-parallel engine, lockstep.py)."""
        self.blocks = blocks
        self.max_batch_size = max_batch_size
        self.context_length = context_length
        self.vocab_size = vocab_size
        self.media_modalities = media_modalities
        self.running: list[Sequence] = []
        self.waiting: deque[Request] = deque()
        self._new_sequence = new_sequence
        self._max_step_tokens = max_step_tokens
        self._pacer = pacer
        self._clock = clock
        self._gather_rows = max(1, max_batch_size // 8)
        self._start()

    def _start(self) -> None:
        """The state a call starts from (`reset` restores it)."""
        self._order = 0
        self._step_rows = self.max_batch_size  # lowered until `reset` by out-of-memory
        self._step_tokens = self._max_step_tokens
        self._gathering = 0  # steps the fresh batch prompts have waited so far
        self._seen_interactive = False  # pacing is consulted only once one was admitted
        # The batch rows and prompt tokens of the last plan when it was paced (not an
        # interactive prefill), for the pacer to learn from its time; else None.
        self.last_paced: tuple[int, int] | None = None

    # -- admission --------------------------------------------------------------------------

    def refusal(self, request: GenerationRequest) -> str | None:
        """The error code of a request that can never run, or None."""
        p = request.params
        if (
            not request.prompt_ids
            or p.max_new_tokens < 1
            or not 1 <= p.n <= self.max_batch_size
            or p.temperature < 0
            or not 0 < p.top_p <= 1
        ):
            return ERROR_INVALID_REQUEST
        if min(request.prompt_ids) < 0 or max(request.prompt_ids) >= self.vocab_size:
            return ERROR_INVALID_REQUEST  # a token the model has no embedding for
        end = 0
        for media in request.media:
            if (
                media.modality not in self.media_modalities
                or media.start < end
                or media.length < 1
                or media.start + media.length >= len(request.prompt_ids)
            ):
                return ERROR_INVALID_REQUEST
            end = media.start + media.length
        total = len(request.prompt_ids) + p.max_new_tokens
        if total > self.context_length:
            return ERROR_CONTEXT_LENGTH
        # Each choice may need its own blocks for the whole context; more than the memory holds
        # could never finish.
        if not self.blocks.could_hold(total, p.n):
            return ERROR_CONTEXT_LENGTH
        return None

    @property
    def holding(self) -> bool:
        """Whether any request is in flight or waiting."""
        return bool(self.running or self.waiting)

    def rows_in_use(self) -> int:
        """Rows held by the requests in flight and waiting: n each."""
        return rows_held(self.running) + sum(r.n for r in self.waiting)

    def holding_interactive(self) -> bool:
        """Whether an interactive request is in flight or waiting."""
        return any(s.owner.priority > 0 for s in self.running) or any(
            r.priority > 0 for r in self.waiting
        )

    def add(self, request: Request) -> None:
        """Queue a request: interactive ones after the interactive ones already waiting,
        parked batch ones (admitted before) in their admission order, new ones last."""
        key = _queue_key(request)
        waiting = self.waiting
        at = len(waiting)
        while at and _queue_key(waiting[at - 1]) > key:
            at -= 1
        waiting.insert(at, request)

    def admit(self) -> list[Request]:
        """Move waiting requests into flight while rows and memory allow, interactive first,
        then oldest first; an interactive one parks batch requests to make room.
        Returns the requests whose admission raised (taken out of the queue)."""
        running, waiting = self.running, self.waiting
        if not waiting:
            return []
        # Blocks the sequences already in flight still need for what they have to compute.
        pending = self._pending(running)
        rows = rows_held(running)
        failed: list[Request] = []
        while waiting:
            request = waiting[0]
            needed = self._needed(request)
            if request.priority > 0:
                while self._short(request.n, rows, pending, needed) and self._park_youngest_batch():
                    pending, rows = self._pending(running), rows_held(running)
            if self._short(request.n, rows, pending, needed):
                break
            waiting.popleft()
            if request.parked:
                running.extend(request.parked)
                request.parked = []
                rows += request.n
                pending += needed
                continue
            self._seen_interactive = self._seen_interactive or request.priority > 0
            try:
                self._order += 1
                request.order = self._order
                running.append(self._new_sequence(request, 0))
            except Exception as exc:
                logger.error("request could not be admitted: %s", exception_trace(exc))
                failed.append(request)
                continue
            rows += request.n
            pending += needed
        return failed

    def abort(self, ids: Collection[str]) -> list[Request]:
        """Take the requests with these ids out of flight and out of the queue; returns them."""
        if not ids:
            return []
        owners: list[Request] = []
        for seq in self.running:
            if seq.owner.spec.id in ids and seq.owner not in owners:
                owners.append(seq.owner)
        self.drop(owners, counted=True)
        for request in [r for r in self.waiting if r.spec.id in ids]:
            self.waiting.remove(request)
            request.generated = _generated(request, request.parked)
            owners.append(request)
        return owners

    def drop(self, owners: list[Request], *, counted: bool = False) -> None:
        """Take every sequence of these requests out of flight, releasing their blocks;
        `counted`: first note on each the tokens it had generated (Request.generated)."""
        if not owners:
            return
        if counted:
            for owner in owners:
                own = [s for s in self.running if s.owner is owner]
                owner.generated = _generated(owner, own + owner.parked)
        keep = []
        for seq in self.running:
            if seq.owner in owners:
                self.blocks.release(seq)
            else:
                keep.append(seq)
        self.running[:] = keep

    def finish(self, finished: list[Sequence]) -> None:
        """Take sequences that ended out of flight, releasing their blocks."""
        if not finished:
            return
        done = set(map(id, finished))
        for seq in finished:
            self.blocks.release(seq)
        self.running[:] = [s for s in self.running if id(s) not in done]

    def reset(self) -> None:
        """Release every block still held and forget every request, in flight or waiting (a
        parked one holds none), and start afresh: a `generate` call ends, however it ends."""
        for seq in self.running:
            self.blocks.release(seq)
        self.running.clear()
        self.waiting.clear()
        self._start()

    def rest(self) -> None:
        """Nothing held: start afresh, as `reset` does (a step size cut by out-of-memory is
        tried whole again, pacing waits for the next interactive request)."""
        if not self.holding:
            self._start()

    # -- what a step computed ---------------------------------------------------------------

    def computed(
        self, work: Work, ok: list[bool], failed: Failed
    ) -> tuple[list[Sequence], list[int]]:
        """Record what the step computed (`ok[i]`: whether work i's forward gave its logits):
        seal the blocks that became full, fork the other choices of a request whose prompt is
        now prefilled. Returns the sequences that sample a token now, with the index in `work`
        of their logits (a fork shares its first choice's)."""
        sampled: list[Sequence] = []
        rows: list[int] = []
        blocks, bs, owners = self.blocks, self.blocks.block_size, failed.owners
        sliding = blocks.window is not None
        for i, (seq, take) in enumerate(work):
            if owners and seq.owner in owners:
                continue
            seq.computed += take
            if len(seq.digests) < seq.computed // bs:
                blocks.seal(seq)
            if sliding:
                blocks.slide(seq)
            if seq.computed < seq.prompt_length + len(seq.tokens) or not ok[i]:
                continue
            sampled.append(seq)
            rows.append(i)
            if seq.choice == 0 and not seq.owner.forked:
                try:
                    forks = self._fork(seq)
                except Exception as exc:
                    logger.error("choices could not be forked: %s", exception_trace(exc))
                    failed.add(seq.owner)
                    continue
                self.running.extend(forks)
                sampled.extend(forks)
                rows.extend([i] * len(forks))
        return sampled, rows

    # -- parking and forks ------------------------------------------------------------------

    def _short(self, n: int, rows: int, pending: int, needed: int) -> bool:
        """Whether a request of n rows and `needed` blocks does not fit now."""
        if rows + n > self.max_batch_size:
            return True
        return bool(self.running) and self.blocks.available - pending < needed

    def _pending(self, running: list[Sequence]) -> int:
        """Blocks the sequences in flight still take: those their tokens fill beyond the table
        they hold (as `BlockManager` grows it), plus one each for the next token. Counted so,
        a running sequence needs what it would need parked (`_needed`): an estimate that
        ignored the room left in its last block parked a batch request for an interactive one
        and readmitted it in the same call, its keys thrown away for nothing."""
        bs = self.blocks.block_size
        return sum(max(0, math.ceil(s.length / bs) - len(s.blocks)) + 1 for s in running)

    def _needed(self, request: Request) -> int:
        """Blocks a waiting request takes to compute what it holds (a parked one: its tokens
        too, each choice on its own, an overestimate where they share their prompt)."""
        bs = self.blocks.block_size
        if request.parked:
            return sum(math.ceil(s.length / bs) + 1 for s in request.parked)
        return math.ceil((len(request.prompt) + 1) / bs) + request.n

    def _park_youngest_batch(self) -> bool:
        """Take the youngest batch request in flight out of it, into the queue; False when
        none is in flight."""
        batch = [s.owner for s in self.running if s.owner.priority <= 0]
        if not batch:
            return False
        victim = max(batch, key=lambda r: r.order)
        keep = []
        for seq in self.running:
            if seq.owner is victim:
                self._preempt(seq)
                victim.parked.append(seq)
            else:
                keep.append(seq)
        self.running[:] = keep
        self.add(victim)
        return True

    def _fork(self, seq: Sequence) -> list[Sequence]:
        """The other n-1 choices of a request, sharing the blocks of its prefilled prompt."""
        owner = seq.owner
        owner.forked = True
        forks = []
        for choice in range(1, owner.n):
            fork = self._new_sequence(owner, choice)
            self.blocks.fork(seq, fork)
            forks.append(fork)
        return forks


def _queue_key(request: Request) -> tuple[int, bool, int]:
    return -request.priority, request.order == 0, request.order


def _generated(owner: Request, sequences: list[Sequence]) -> int:
    """Tokens a request's choices generated: those that ended and those still in `sequences`."""
    return sum(len(c.token_ids) for c in owner.choices.values()) + sum(
        len(s.tokens) for s in sequences
    )
