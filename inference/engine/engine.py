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

Interactive requests (priority > 0) go ahead of batch ones and take their rows when none is
free (scheduler.py: its waiting queue is ordered by priority, the one place "interactive
first" is decided); while the engine holds one, its caller polls aborts at every step, so a
client that went away frees its rows within a step. A streaming request (`stream`) gets each
step's new text as a `PartialResult` before its result.

The engine core has verbs, as vLLM's and nano-vllm's: `add` a request, `abort` ids, `step`
(admit, run one step or one decoding run, and return the outputs since the last step), over one
scheduler for the engine's life; `generate` is a loop over them that pulls from a list.

This module is the verbs and that loop: polling aborts, choosing a single step or a decoding
run, gathering the outputs, busy-time shares. What it drives is in modules of their own: the
state in flight (sequence.py), admission and preemption (scheduler.py), each step's plan
(planning.py), block tables and the prefix cache (blocks.py, the only code touching the pool's
reference counts), taking a step or a decoding run (stepping.py, runs.py), appending sampled
tokens, stop strings and results (outputs.py), and the model's inputs, forward and logits
(runner.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, TypeVar

import torch

from .blocks import BlockManager
from .config import EngineConfig
from .decoding import TextDecoder, token_ids
from .outputs import empty_result, partials, results
from .pacing import BatchPacer
from .runner import ModelRunner
from .runs import plan_run
from .sampling import row_sampling
from .scheduler import Scheduler
from .sequence import Request, Sequence
from .stepping import Stepper
from .types import ERROR_INTERNAL, GenerationRequest, GenerationResult, PartialResult

T = TypeVar("T")
# How the engine reads what wall-clock time decides (lockstep.py): `agree(kind, read)` is
# `read()` in one process; on a tensor-parallel engine the leader's reading, on every rank.
Agree = Callable[[str, Callable[[], Any]], Any]


def _alone(kind: str, read: Callable[[], T]) -> T:
    return read()


class Engine:
    """Generates for a stream of requests with one model; one `generate` call at a time.
    A `GenerationEngine` (protocol.py)."""

    # A request whose work raises ends as its own error result, but one that makes `generate`
    # itself raise is for `Contained` to isolate; nothing here marks the engine broken.
    contains_failures = False
    broken = False

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: EngineConfig,
        *,
        processor: Any = None,
        ranks_check: Callable[[], None] | None = None,
        agree: Agree | None = None,
    ) -> None:
        """`config`: how the engine runs (config.py). `processor`: the model's processor,
        for requests with media (media.py). `ranks_check`: on tensor-parallel ranks, whether
        every rank is still there (lockstep.ranks_check). `agree`: on tensor-parallel ranks,
        the leader's reading of what wall-clock time decides (a step's time, the pacer's
        clock, whether a decoding run stops), so every rank plans alike (lockstep.agreement)."""
        self.config = config
        self._agree: Agree = agree or _alone
        self._runner = ModelRunner(
            model,
            tokenizer,
            context_length=config.context_length,
            max_batch_size=config.max_batch_size,
            block_size=config.block_size,
            kv_cache_bytes=config.kv_cache_bytes,
            max_num_blocks=config.max_num_blocks,
            processor=processor,
            ranks_check=ranks_check,
            cuda_graphs=config.cuda_graphs,
        )
        self.model = model
        self.tokenizer = tokenizer
        self.context_length = config.context_length
        self.max_batch_size = config.max_batch_size
        self.abort_poll_seconds = config.abort_poll_seconds
        self.prefix_cache = config.prefix_cache
        self.block_size = config.block_size
        self.kv_cache_bytes = self._runner.kv_cache_bytes
        self.media_modalities = self._runner.media_modalities
        eos = config.eos_token_ids
        self.eos_token_ids = frozenset(
            eos if eos is not None else _model_eos_ids(model, tokenizer)
        ) | frozenset(token_ids(tokenizer, config.turn_end_tokens))
        self._decoder = TextDecoder(tokenizer, config.markup_tokens)
        self.busy_seconds_total = 0.0  # over the engine's life; the results' shares sum to it
        self._eos_sorted = sorted(self.eos_token_ids)
        max_step_tokens = config.max_step_tokens
        if max_step_tokens is None:
            max_step_tokens = 2048 if self._runner.device.type == "cuda" else 512
        self.max_step_tokens = max(max_step_tokens, self.max_batch_size)
        self._blocks = BlockManager(
            self._runner.pool, prefix_cache=config.prefix_cache, window=self._runner.window
        )
        # Decoding runs (runs.py) need the aborts polled by time, not at every step.
        self._runs = config.abort_poll_seconds > 0
        # Caps batch work beside interactive requests, learned across calls (pacing.py).
        self._pacer = BatchPacer(
            config.interactive_step_seconds,
            max_rows=self.max_batch_size,
            max_tokens=self.max_step_tokens,
            block_size=self.block_size,
        )
        self._scheduler = Scheduler(
            self._blocks,
            max_batch_size=self.max_batch_size,
            max_step_tokens=self.max_step_tokens,
            context_length=self.context_length,
            vocab_size=self._runner.vocab_size,
            media_modalities=self.media_modalities,
            new_sequence=self._sequence,
            pacer=self._pacer,
            clock=lambda: self._agree("now", time.monotonic),
        )
        self._stepper = Stepper(
            self._scheduler,
            self._runner,
            eos_token_ids=self.eos_token_ids,
            decoder=self._decoder,
        )
        # What `add` and `abort` answer at once, for the next `step` to return first.
        self._outbox: list[GenerationResult | PartialResult] = []
        self._step_seconds = 0.0  # the last step's work (the abort poll's clock)
        self._call: object | None = None  # the `generate` call running, if any

    def clear_prefix_cache(self) -> None:
        """Forget the cached blocks of finished requests (between calls: not while requests
        are held)."""
        self._blocks.clear_cache()

    # -- the verbs ---------------------------------------------------------------------------

    def add(self, request: GenerationRequest) -> None:
        """Queue a request. One that can never run (context_length_exceeded,
        invalid_request) comes out of the next `step` as its error result instead."""
        self._queue(request)

    def abort(self, request_ids: Collection[str]) -> None:
        """Stop the requests held (in flight or waiting) with these ids, freeing their
        blocks; their results (aborted=True) come out of the next `step`. Ids not held are
        ignored."""
        for owner in self._scheduler.abort(request_ids):
            owner.reported = True
            self._outbox.append(empty_result(owner, aborted=True))

    def step(
        self,
        *,
        interrupt: Callable[[], bool] | None = None,
        run_seconds: float = math.inf,
        wait: float = 0.0,
    ) -> list[GenerationResult | PartialResult]:
        """Admit what fits and, when something is in flight, run one step: or, given
        `interrupt`, a decoding run of up to MAX_RUN_STEPS when its plan is known (runs.py),
        ended early by `interrupt()` (something new came for the engine) or after
        `run_seconds`. Returns the outputs of `add` and `abort` since the last step, then the
        requests whose admission failed (internal_error), then the step's partial texts,
        finished results and failed requests. `wait` is the protocol's (protocol.py): an
        engine in this process computes, it never waits."""
        scheduler = self._scheduler
        self._step_seconds = 0.0
        for owner in scheduler.admit():
            self._outbox.append(empty_result(owner, error=ERROR_INTERNAL))
        if scheduler.running:
            self._outbox.extend(self._step_running(interrupt, run_seconds))
        if not scheduler.holding:
            scheduler.rest()  # idle: a step cut by out-of-memory, and pacing, start afresh
        return self._drain()

    @property
    def credit(self) -> int:
        """Requests to add ahead of their results: the rows (more only wait in the queue)."""
        return self.max_batch_size

    @property
    def has_unfinished(self) -> bool:
        """Whether requests are held or outputs wait for the next `step`."""
        return self._scheduler.holding or bool(self._outbox)

    @property
    def rows_in_use(self) -> int:
        """Rows held by the requests in flight and waiting: n each."""
        return self._scheduler.rows_in_use()

    def _queue(self, request: GenerationRequest, *, aborted: bool = False) -> bool:
        """Add a request to the scheduler, or its result (refused, else `aborted`) to the
        outbox; returns whether it was queued."""
        error = self._scheduler.refusal(request)
        if error or aborted:
            self._outbox.append(empty_result(Request(request), error=error, aborted=not error))
            return False
        self._scheduler.add(Request(request))
        return True

    def _drain(self) -> list[GenerationResult | PartialResult]:
        outputs, self._outbox = self._outbox, []
        return outputs

    def reset(self) -> list[GenerationRequest]:
        """Drop every request held and every output not taken, releasing their blocks.
        Returns the requests dropped that were never admitted (nothing of theirs ran), in
        their queue order: a caller may add them again."""
        unstarted = [r.spec for r in self._scheduler.waiting if not r.order]
        self._scheduler.reset()
        self._outbox.clear()
        return unstarted

    def _step_running(
        self, interrupt: Callable[[], bool] | None, run_seconds: float
    ) -> list[GenerationResult | PartialResult]:
        scheduler = self._scheduler
        agree = self._agree
        began = time.perf_counter()
        with torch.inference_mode():
            run = None
            if self._runs and interrupt is not None:
                run = plan_run(scheduler, self._runner)
            if run is None or interrupt is None:
                stepped, advanced, finished, failed = self._stepper.step()
            else:
                until = began + run_seconds
                asked = interrupt

                def stop() -> bool:
                    return agree("run", lambda: asked() or time.perf_counter() >= until)

                stepped, advanced, finished, failed = self._stepper.run(run, stop=stop)
        spent = agree("spent", lambda: time.perf_counter() - began)
        self._step_seconds = self._account(spent, stepped)
        if scheduler.last_paced is not None:
            rows, tokens = scheduler.last_paced
            self._pacer.observe(spent, batch_rows=rows, batch_tokens=tokens)
        outputs: list[GenerationResult | PartialResult] = [*partials(advanced, self._decoder)]
        outputs.extend(results(finished))
        for owner in failed.owners:
            if not owner.reported:
                owner.reported = True
                outputs.append(empty_result(owner, error=ERROR_INTERNAL))
        return outputs

    # -- the loop --------------------------------------------------------------------------

    def generate(
        self,
        requests: Iterable[GenerationRequest],
        *,
        aborted: Callable[[], Collection[str]] | None = None,
    ) -> Iterator[GenerationResult | PartialResult]:
        """Pulls requests lazily from `requests` as rows free up (continuous batching),
        yields each result as soon as it finishes (not in input order). At most
        `max_batch_size` rows (n per request) are in flight or waiting for memory.
        `aborted()` is polled about every `abort_poll_seconds` of work, and at every step
        while an interactive request is held; requests whose id it returns are stopped and
        yielded with aborted=True. Invalid requests (context_length_exceeded,
        invalid_request) are yielded immediately as error results. A request with `stream`
        also gets PartialResults, its new text after each step, before its result.

        A loop over `add`, `abort` and `step` for callers that pull from a list (tests,
        benchmarks, a warm-up); the worker drives the verbs itself. What it holds is dropped
        (its blocks released) when it ends, however it ends. One call at a time: a call
        started while another is open (abandoned without being closed) takes the engine
        over, dropping what the other held; the other must not be resumed.
        """
        source = iter(requests)
        self.reset()
        call = self._call = object()
        exhausted = False
        aborted_ids: frozenset[str] = frozenset()
        work_since_poll = float("inf")
        scheduler = self._scheduler
        try:
            while True:
                if (
                    aborted is not None
                    and scheduler.holding
                    and (
                        work_since_poll >= self.abort_poll_seconds
                        or scheduler.holding_interactive()
                    )
                ):
                    aborted_ids = frozenset(aborted())
                    work_since_poll = 0.0
                    self.abort(aborted_ids)
                    yield from self._drain()

                in_use = 0 if exhausted else self.rows_in_use
                while not exhausted and in_use < self.max_batch_size:
                    request = next(source, None)
                    if request is None:
                        exhausted = True
                        break
                    if self._queue(request, aborted=request.id in aborted_ids):
                        in_use += request.params.n
                    yield from self._drain()

                budget = self.abort_poll_seconds - work_since_poll if aborted else math.inf
                # The source would not be asked before rows free up: plan ahead.
                plan_ahead = exhausted or in_use >= self.max_batch_size
                yield from self.step(interrupt=_never if plan_ahead else None, run_seconds=budget)
                work_since_poll += self._step_seconds
                if exhausted and not scheduler.holding:
                    return
        finally:
            if self._call is call:  # (not taken over: an abandoned call closes late)
                self._call = None
                self.reset()

    def _account(self, spent: float, sequences: list[Sequence]) -> float:
        if not sequences:
            return spent
        self.busy_seconds_total += spent
        share = spent / len(sequences)
        for seq in sequences:
            seq.owner.busy += share
        return spent

    def _sequence(self, request: Request, choice: int) -> Sequence:
        sampling = row_sampling(
            request.spec.params,
            choice=choice,
            eos_ids=self._eos_sorted,
            vocab_size=self._runner.vocab_size,
            device=self._runner.device,
            tokenizer=self.tokenizer,  # hook (chat surface): grammar matchers, token bytes
        )
        params = request.spec.params
        seq = Sequence(
            owner=request,
            choice=choice,
            sampling=sampling,
            runs_ahead=(
                sampling.draws_only
                and not params.stop
                and not request.spec.stream
                and not request.spec.media
                and request.priority <= 0
            ),
        )
        self._blocks.index_prompt(seq)
        return seq


def _never() -> bool:
    return False


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
