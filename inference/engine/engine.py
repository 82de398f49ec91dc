"""Continuous batching over a transformers causal LM, with paged key/value memory.

Up to `max_batch_size` sequences are in flight. Every step schedules, under a token budget
(`max_step_tokens`), one new token for each decoding sequence and then pieces of the prompts
still being prefilled (chunked prefill: a long prompt never stalls the decoding rows for more
than one step's budget). Keys and values live in fixed-size blocks (kv.py) handed out as tokens
arrive and returned as sequences finish; a request is admitted only when the memory left can
take its prompt, and when decoding runs out of blocks the youngest sequence is preempted (its
blocks released, its tokens kept) and recomputed later, so memory never overflows.

Full blocks are kept, keyed by a hash of their tokens, their prefix and the request's cache
scope, after their request ends: a later prompt with the same prefix (a system prompt shared by
a whole file, the n choices of one request) reads them instead of recomputing them, until the
least recently used ones are evicted for memory.

A request whose own work raises (its prompt, its sampling, its forward when run alone) ends
with `error="internal_error"`; the others go on. Out of memory in a step halves the step and
tries again.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

import torch

from .blocks import BlockManager
from .runner import ModelRunner
from .sampling import row_sampling
from .sequence import Failed, Request, Sequence, age, rows_held
from .types import (
    ERROR_CONTEXT_LENGTH,
    ERROR_INTERNAL,
    ERROR_INVALID_REQUEST,
    FINISH_LENGTH,
    FINISH_STOP,
    NOT_READY,
    Choice,
    GenerationRequest,
    GenerationResult,
)

logger = logging.getLogger(__name__)


class Engine:
    """Generates for a stream of requests with one model; one `generate` call at a time."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        context_length: int,
        max_batch_size: int = 32,
        eos_token_ids: Collection[int] | None = None,
        abort_poll_seconds: float = 0.5,
        max_step_tokens: int | None = None,
        block_size: int = 16,
        kv_cache_bytes: int | None = None,
        max_num_blocks: int | None = None,
        prefix_cache: bool = True,
        processor: Any = None,
    ) -> None:
        self._runner = ModelRunner(
            model,
            tokenizer,
            context_length=context_length,
            max_batch_size=max_batch_size,
            block_size=block_size,
            kv_cache_bytes=kv_cache_bytes,
            max_num_blocks=max_num_blocks,
            processor=processor,
        )
        self.model = model
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.max_batch_size = max_batch_size
        self.abort_poll_seconds = abort_poll_seconds
        self.prefix_cache = prefix_cache
        self.block_size = block_size
        self.kv_cache_bytes = self._runner.kv_cache_bytes
        self.media_modalities = self._runner.media_modalities
        self.eos_token_ids = frozenset(
            eos_token_ids if eos_token_ids is not None else _model_eos_ids(model, tokenizer)
        )
        self.busy_seconds_total = 0.0  # over the engine's life; the results' shares sum to it
        self._eos_sorted = sorted(self.eos_token_ids)
        if max_step_tokens is None:
            max_step_tokens = 2048 if self._runner.device.type == "cuda" else 512
        self.max_step_tokens = max(max_step_tokens, max_batch_size)
        self._blocks = BlockManager(self._runner.pool, prefix_cache=prefix_cache)
        self._order = 0
        self._step_rows = max_batch_size  # lowered for the rest of a call by out-of-memory
        self._step_tokens = self.max_step_tokens

    def clear_prefix_cache(self) -> None:
        """Forget the cached blocks of finished requests (not while `generate` runs)."""
        self._blocks.clear_cache()

    # -- the loop --------------------------------------------------------------------------

    def generate(
        self,
        requests: Iterable[GenerationRequest],
        *,
        aborted: Callable[[], Collection[str]] | None = None,
    ) -> Iterator[GenerationResult]:
        """Pulls requests lazily from `requests` as capacity frees up (continuous batching),
        yields each result as soon as it finishes (not in input order). `requests` may yield
        NOT_READY while this holds a request: nothing more now, step and ask again.

        At most `max_batch_size` sequences (n per request) are in flight or waiting for
        memory. `aborted()` is polled about every `abort_poll_seconds` of work; requests whose
        id it returns are stopped and yielded with aborted=True. Invalid requests
        (context_length_exceeded, invalid_request) are yielded immediately as error results.
        """
        source = iter(requests)
        running: list[Sequence] = []
        waiting: deque[Request] = deque()
        exhausted = False
        aborted_ids: frozenset[str] = frozenset()
        work_since_poll = float("inf")
        self._step_rows, self._step_tokens = self.max_batch_size, self.max_step_tokens
        try:
            while True:
                if (
                    aborted is not None
                    and (running or waiting)
                    and work_since_poll >= self.abort_poll_seconds
                ):
                    aborted_ids = frozenset(aborted())
                    work_since_poll = 0.0
                    yield from self._abort(running, waiting, aborted_ids)

                in_use = rows_held(running) + sum(r.n for r in waiting)
                while in_use < self.max_batch_size and not exhausted:
                    try:
                        request = next(source)
                    except StopIteration:
                        exhausted = True
                        break
                    if request is NOT_READY:  # step what is held; ask again after it
                        break
                    error = self._invalid(request)
                    if error or request.id in aborted_ids:
                        yield _empty_result(Request(request), error=error, aborted=not error)
                        continue
                    waiting.append(Request(request))
                    in_use += request.params.n

                yield from self._admit(running, waiting)

                if not running:
                    if exhausted and not waiting:
                        return
                    continue

                began = time.perf_counter()
                with torch.inference_mode():
                    stepped, finished, failed = self._step(running)
                work_since_poll += self._account(began, stepped)
                yield from self._results(finished)
                for owner in failed.owners:
                    if not owner.reported:
                        owner.reported = True
                        yield _empty_result(owner, error=ERROR_INTERNAL)
        finally:
            for seq in running:
                self._blocks.release(seq)

    def _account(self, began: float, sequences: list[Sequence]) -> float:
        spent = time.perf_counter() - began
        if not sequences:
            return spent
        self.busy_seconds_total += spent
        share = spent / len(sequences)
        for seq in sequences:
            seq.owner.busy += share
        return spent

    def _results(self, finished: list[Sequence]) -> Iterator[GenerationResult]:
        for seq in finished:
            owner = seq.owner
            if len(owner.choices) == owner.n and not owner.reported:
                owner.reported = True
                choices = [owner.choices[i] for i in range(owner.n)]
                yield GenerationResult(
                    id=owner.request.id,
                    choices=choices,
                    prompt_tokens=len(owner.prompt),
                    completion_tokens=sum(len(c.token_ids) for c in choices),
                    cached_tokens=owner.cached_tokens,
                    busy_seconds=owner.busy,
                    params=owner.request.params,  # hook (chat surface): echoed for the body
                )

    def _invalid(self, request: GenerationRequest) -> str | None:
        p = request.params
        if (
            not request.prompt_ids
            or p.max_new_tokens < 1
            or not 1 <= p.n <= self.max_batch_size
            or p.temperature < 0
            or not 0 < p.top_p <= 1
        ):
            return ERROR_INVALID_REQUEST
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
        if not self._blocks.could_hold(total, p.n):
            return ERROR_CONTEXT_LENGTH
        return None

    def _abort(
        self, running: list[Sequence], waiting: deque[Request], ids: frozenset[str]
    ) -> Iterator[GenerationResult]:
        if not ids:
            return
        owners: list[Request] = []
        for seq in running:
            if seq.owner.request.id in ids and seq.owner not in owners:
                owners.append(seq.owner)
        self._drop(running, owners)
        for request in [r for r in waiting if r.request.id in ids]:
            waiting.remove(request)
            owners.append(request)
        for owner in owners:
            owner.reported = True
            yield _empty_result(owner, aborted=True)

    def _drop(self, running: list[Sequence], owners: list[Request]) -> None:
        """Take every sequence of these requests out of flight, releasing their blocks."""
        if not owners:
            return
        keep = []
        for seq in running:
            if seq.owner in owners:
                self._blocks.release(seq)
            else:
                keep.append(seq)
        running[:] = keep

    # -- admission --------------------------------------------------------------------------

    def _admit(
        self, running: list[Sequence], waiting: deque[Request]
    ) -> Iterator[GenerationResult]:
        """Move waiting requests into flight while rows and memory allow, oldest first."""
        bs = self.block_size
        # Blocks the sequences already in flight still need for what they have to compute.
        pending = sum(math.ceil((s.length - s.computed) / bs) + 1 for s in running)
        rows = rows_held(running)
        while waiting:
            request = waiting[0]
            needed = math.ceil((len(request.prompt) + 1) / bs) + request.n
            if rows + request.n > self.max_batch_size or (
                running and self._blocks.available - pending < needed
            ):
                return
            waiting.popleft()
            try:
                self._order += 1
                request.order = self._order
                running.append(self._sequence(request, 0))
            except Exception as exc:
                logger.error("request could not be admitted: %s", type(exc).__name__)
                yield _empty_result(request, error=ERROR_INTERNAL)
                continue
            rows += request.n
            pending += needed

    def _sequence(self, request: Request, choice: int) -> Sequence:
        sampling = row_sampling(
            request.request.params,
            choice=choice,
            eos_ids=self._eos_sorted,
            vocab_size=self._runner.vocab_size,
            device=self._runner.device,
            tokenizer=self.tokenizer,  # hook (chat surface): grammar matchers, token bytes
        )
        seq = Sequence(owner=request, choice=choice, sampling=sampling)
        self._blocks.index_prompt(seq)
        return seq

    # -- one step ---------------------------------------------------------------------------

    def _step(self, running: list[Sequence]) -> tuple[list[Sequence], list[Sequence], Failed]:
        """Schedule, run and sample one step. Returns the sequences that took part, those
        that finished and the requests that failed (already out of flight)."""
        failed = Failed()
        while True:
            work = self._schedule(running)
            try:
                logits = self._runner.run(work, failed)
                break
            except torch.OutOfMemoryError:
                if len(work) <= 1 and sum(t for _, t in work) <= 1:
                    for seq, _ in work:
                        failed.add(seq.owner)
                    self._drop(running, failed.owners)
                    return [s for s, _ in work], [], failed
                logger.warning("out of memory in a step of %d sequences; halving", len(work))
                self._step_rows = max(1, len(work) // 2)
                self._step_tokens = max(1, sum(t for _, t in work) // 2)
                self._runner.release_memory()

        stepped = [seq for seq, _ in work]
        sampled: list[Sequence] = []
        rows: list[torch.Tensor] = []
        for (seq, take), row in zip(work, logits, strict=True):
            if seq.owner in failed.owners:
                continue
            seq.computed += take
            self._blocks.seal(seq)
            if seq.computed < seq.length or row is None:
                continue
            sampled.append(seq)
            rows.append(row)
            if seq.choice == 0 and seq.owner.n > 1 and not seq.owner.forked:
                try:
                    forks = self._fork(seq)
                except Exception as exc:
                    logger.error("choices could not be forked: %s", type(exc).__name__)
                    failed.add(seq.owner)
                    continue
                running.extend(forks)
                sampled.extend(forks)
                rows.extend([row] * len(forks))
        self._drop(running, failed.owners)
        keep = [i for i, seq in enumerate(sampled) if seq.owner not in failed.owners]
        sampled = [sampled[i] for i in keep]
        if not sampled:
            return stepped, [], failed
        tokens = self._runner.next_tokens(torch.stack([rows[i] for i in keep]), sampled, failed)
        finished = self._advance(running, sampled, tokens, failed)
        self._drop(running, failed.owners)
        return stepped, finished, failed

    def _schedule(self, running: list[Sequence]) -> list[tuple[Sequence, int]]:
        """Pick (sequence, tokens to compute) for this step, reserving their blocks."""
        budget = self._step_tokens
        limit = self._step_rows
        # Decoding sequences first (one token each), oldest first; preempt the youngest when
        # their new blocks do not fit.
        decoding = [s for s in running if s.length - s.computed == 1][: min(budget, limit)]
        while True:
            short = sum(1 for s in decoding if self._blocks.needed(s, 1)) - self._blocks.available
            if short <= 0:
                break
            victim = self._youngest_holder(running)
            if victim is None or (victim in decoding and len(decoding) == 1):
                break
            self._preempt(victim)
            if victim in decoding:
                decoding.remove(victim)
        work: list[tuple[Sequence, int]] = []
        for seq in decoding:
            if self._blocks.grow(seq, 1):
                work.append((seq, 1))
        budget -= len(work)
        deferred = self._schedule_prompts(running, work, budget, limit, wait=self.prefix_cache)
        if not work and deferred:
            # Waiting for a block that cannot be computed now (memory) would stall everyone.
            self._schedule_prompts(running, work, budget, limit, wait=False)
        if not work:
            # Every sequence is waiting for memory: free the youngest and go on with the rest.
            victim = self._youngest_holder(running)
            if victim is not None and victim is not min(running, key=age):
                self._preempt(victim)
                return self._schedule(running)
            raise RuntimeError("no sequence can be scheduled")  # cannot happen: see _invalid
        return work

    def _schedule_prompts(
        self,
        running: list[Sequence],
        work: list[tuple[Sequence, int]],
        budget: int,
        limit: int,
        *,
        wait: bool,
    ) -> bool:
        """Add pieces of prompts to `work`, oldest first; returns whether a sequence waited.

        With `wait`, a sequence whose next block is one an older sequence has still to compute
        skips the step and reads that block from the cache once it is there: a prefix shared
        by many rows admitted together is computed once, not once per row.
        """
        bs = self.block_size
        coming: set[bytes] = set()
        deferred = False
        for seq in sorted(running, key=age):
            if budget <= 0 or len(work) >= limit:
                break
            if seq.length - seq.computed <= 1:
                continue
            self._blocks.reuse_cached(seq)
            if wait:
                pending = seq.prompt_digests[seq.computed // bs :]
                if pending and seq.computed % bs == 0 and pending[0] in coming:
                    deferred = True
                    continue
                coming.update(pending)
            take = self._blocks.grow(seq, min(seq.length - seq.computed, budget))
            if take:
                work.append((seq, take))
                budget -= take
        return deferred

    def _youngest_holder(self, running: list[Sequence]) -> Sequence | None:
        holders = [s for s in running if s.blocks]
        return max(holders, key=age) if holders else None

    def _preempt(self, seq: Sequence) -> None:
        """Give a sequence's blocks back; it keeps its tokens and is recomputed later."""
        self._blocks.reset(seq)
        seq.preempted = True

    def _fork(self, seq: Sequence) -> list[Sequence]:
        """The other n-1 choices of a request, sharing the blocks of its prefilled prompt."""
        owner = seq.owner
        owner.forked = True
        forks = []
        for choice in range(1, owner.n):
            fork = self._sequence(owner, choice)
            self._blocks.fork(seq, fork)
            forks.append(fork)
        return forks

    # -- sampling and appending -------------------------------------------------------------

    def _advance(
        self,
        running: list[Sequence],
        sequences: list[Sequence],
        tokens: list[int | None],
        failed: Failed,
    ) -> list[Sequence]:
        """Append each sequence's new token; take out and return those that finished."""
        finished: list[Sequence] = []
        for seq, token in zip(sequences, tokens, strict=True):
            if token is None or seq.owner in failed.owners:
                continue
            try:
                reason = self._append(seq, token)
            except Exception as exc:
                logger.error("a sequence could not be advanced: %s", type(exc).__name__)
                failed.add(seq.owner)
                continue
            if reason is not None:
                finished.append(seq)
        if finished:
            done = set(map(id, finished))
            for seq in finished:
                self._blocks.release(seq)
            running[:] = [s for s in running if id(s) not in done]
        return finished

    def _append(self, seq: Sequence, token: int) -> str | None:
        seq.tokens.append(token)
        params = seq.owner.request.params
        stopped = token in self.eos_token_ids and not params.ignore_eos
        text = None
        if not stopped and params.stop:
            text = self._stopped_text(seq.tokens, params.stop)
            stopped = text is not None
        if stopped:
            reason = FINISH_STOP
        elif len(seq.tokens) >= params.max_new_tokens:
            reason = FINISH_LENGTH
        else:
            return None
        if text is None:
            text = self.tokenizer.decode(seq.tokens, skip_special_tokens=True)
        seq.owner.choices[seq.choice] = Choice(
            index=seq.choice,
            token_ids=list(seq.tokens),
            text=text,
            finish_reason=reason,
            logprobs=seq.sampling.logprobs,  # hook (chat surface): recorded by sample()
        )
        return reason

    def _stopped_text(self, tokens: list[int], stops: tuple[str, ...]) -> str | None:
        """The text cut before the first stop string, if the last token completed one."""
        # A token is at least one byte and a character at most four, so this many tail tokens
        # hold any stop string that the newest token could have completed.
        tail = 4 * max(len(s) for s in stops) + 4
        recent = self.tokenizer.decode(tokens[-tail:], skip_special_tokens=True)
        if not any(s in recent for s in stops):
            return None
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
        return text[: min(cuts)] if cuts else None


def _empty_result(
    request: Request, *, error: str | None = None, aborted: bool = False
) -> GenerationResult:
    return GenerationResult(
        id=request.request.id,
        choices=[],
        prompt_tokens=len(request.prompt),
        completion_tokens=0,
        cached_tokens=request.cached_tokens,
        busy_seconds=request.busy,
        aborted=aborted,
        error=error,
    )


def _model_eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
