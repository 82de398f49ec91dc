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

from .allocator import keep_freed_memory
from .blocks import BlockManager
from .kv import BlockPool, PagedCache
from .media import MediaEncoder
from .sampling import row_sampling, sample
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

_SUPPORTED_ATTENTION = ("sdpa", "eager")
# Without a GPU (or an explicit size), the key/value memory holds every row at full context,
# up to this many bytes.
_CPU_KV_BYTES = 2 * 1024**3
# On a GPU, the share of the memory free after the weights that keys and values may take; the
# rest is left to activations (the gathered context of one layer at a time, and logits).
_GPU_MEMORY_FRACTION = 0.85


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
        config = model.config
        attention = getattr(config, "_attn_implementation", "sdpa")
        if attention not in _SUPPORTED_ATTENTION:
            raise ValueError(f"attention {attention!r} is not supported; load with sdpa or eager")
        text = config.get_text_config(decoder=True)
        window = getattr(text, "sliding_window", None)
        if window and getattr(text, "use_sliding_window", True) and window < context_length:
            raise ValueError(
                "models with a sliding window shorter than the context are not supported"
            )
        keep_freed_memory()  # the process's allocator, once: steps reuse freed memory
        self.model = model
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.max_batch_size = max_batch_size
        self.abort_poll_seconds = abort_poll_seconds
        self.prefix_cache = prefix_cache
        # Media rows need the model's processor (its encoders run at prefill, media.py).
        self._media = MediaEncoder(model, processor) if processor is not None else None
        self.media_modalities = self._media.modalities if self._media else frozenset()
        self.eos_token_ids = frozenset(
            eos_token_ids if eos_token_ids is not None else _model_eos_ids(model, tokenizer)
        )
        self.busy_seconds_total = 0.0  # over the engine's life; the results' shares sum to it
        self._attention = attention
        self._device = model.get_input_embeddings().weight.device
        self._dtype = model.get_input_embeddings().weight.dtype
        self._vocab_size = model.get_output_embeddings().weight.shape[0]
        self._tokenizer_size = len(tokenizer)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._eos_sorted = sorted(self.eos_token_ids)
        on_gpu = self._device.type == "cuda"
        if max_step_tokens is None:
            max_step_tokens = 2048 if on_gpu else 512
        self.max_step_tokens = max(max_step_tokens, max_batch_size)

        layers = text.num_hidden_layers
        kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        element = torch.empty((), dtype=self._dtype).element_size()
        self.block_size = block_size
        block_bytes = 2 * layers * kv_heads * head_dim * element * block_size
        self._key_width = head_dim * kv_heads / text.num_attention_heads
        if max_num_blocks is None:
            if kv_cache_bytes is None:
                kv_cache_bytes = self._default_kv_bytes(block_bytes // block_size, layers)
            max_num_blocks = kv_cache_bytes // block_bytes
        self.kv_cache_bytes = max_num_blocks * block_bytes
        self._pool = BlockPool(
            num_layers=layers,
            num_blocks=max_num_blocks,
            block_size=block_size,
            kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=self._dtype,
            device=self._device,
        )
        self._cache = PagedCache(self._pool)
        self._blocks = BlockManager(self._pool, prefix_cache=prefix_cache)
        self._order = 0
        self._step_rows = max_batch_size  # lowered for the rest of a call by out-of-memory
        self._step_tokens = self.max_step_tokens

    def clear_prefix_cache(self) -> None:
        """Forget the cached blocks of finished requests (not while `generate` runs)."""
        self._blocks.clear_cache()

    def _default_kv_bytes(self, token_bytes: int, layers: int) -> int:
        everything = self.max_batch_size * self.context_length * token_bytes
        if self._device.type != "cuda":
            return min(everything, _CPU_KV_BYTES)
        free, _ = torch.cuda.mem_get_info(self._device)
        # Attention gathers one layer's context at a time: 1/layers of the memory on top.
        usable = int(free * _GPU_MEMORY_FRACTION * layers / (layers + 1))
        return min(everything, usable)

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
            vocab_size=self._vocab_size,
            device=self._device,
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
                logits = self._run(work, failed)
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
                if self._device.type == "cuda":
                    torch.cuda.empty_cache()

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
        tokens = self._sample(torch.stack([rows[i] for i in keep]), sampled, failed)
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

    # -- the forward ------------------------------------------------------------------------

    def _run(self, work: list[tuple[Sequence, int]], failed: Failed) -> list[torch.Tensor | None]:
        """Logits of the last computed position of each scheduled sequence (None for one
        whose forward failed). Decoding rows and prompt pieces run as two forwards, so one
        token rows are not padded to a prompt piece's length."""
        logits: list[torch.Tensor | None] = [None] * len(work)
        for single in (True, False):
            group = [i for i, (_, take) in enumerate(work) if (take == 1) == single]
            if not group:
                continue
            try:
                out = self._forward([work[i] for i in group])
            except torch.OutOfMemoryError:
                raise
            except Exception as exc:
                if len(group) == 1:
                    logger.error("a sequence's forward failed: %s", type(exc).__name__)
                    failed.add(work[group[0]][0].owner)
                    continue
                # Find the culprit: each sequence alone.
                for i in group:
                    try:
                        logits[i] = self._forward([work[i]])[0]
                    except torch.OutOfMemoryError:
                        raise
                    except Exception as alone:
                        logger.error("a sequence's forward failed: %s", type(alone).__name__)
                        failed.add(work[i][0].owner)
                continue
            for row, i in enumerate(group):
                logits[i] = out[row]
        return logits

    def _forward(self, work: list[tuple[Sequence, int]]) -> torch.Tensor:
        """Last-position logits ([rows, vocab]) of one forward over the scheduled tokens.

        Two layouts, whichever costs less (`_decode_padded`):

        - packed: the scheduled tokens (pieces of prompts, or one per decoding row) form one
          `[1, tokens]` row. Their keys are the union of the slots their sequences attend to,
          each slot once however many sequences share it (a common prefix's blocks), and a
          mask says which query may see which slot: one attention product for the step, no
          padding, no copy of a shared block per row.
        - padded (decoding rows only): a `[rows, 1]` batch, each row attending to its own
          context padded to the longest. Without shared blocks the packed product costs
          rows x (sum of the contexts), this one rows x (the longest), but each row's keys
          are gathered even where rows share them.
        """
        device, bs = self._device, self.block_size
        takes_list = [take for _, take in work]
        starts_list = [seq.computed for seq, _ in work]
        lengths_list = [a + b for a, b in zip(starts_list, takes_list, strict=True)]
        width = math.ceil(max(lengths_list) / bs)
        tables = [seq.blocks[:width] + [0] * (width - len(seq.blocks)) for seq, _ in work]
        table = _to(tables, device)
        lengths = _to(lengths_list, device)
        padded = max(takes_list) == 1 and _decode_padded(tables, lengths_list, bs, self._key_width)
        if padded:
            ids = _to([seq.span(seq.computed, seq.computed + 1) for seq, _ in work], device)
            k = torch.arange(width * bs, device=device)
            inside = k[None, :] < lengths[:, None]
            read = torch.where(inside, table[:, k // bs] * bs + k % bs, 0)
            positions = (lengths - 1)[:, None]
            write = table.gather(1, positions // bs) * bs + positions % bs
            allowed = inside[:, None, None, :]
            keep: int | torch.Tensor = 1
        else:
            ids = _to(
                [[t for seq, take in work for t in seq.span(seq.computed, seq.computed + take)]],
                device,
            )
            takes, starts = _to(takes_list, device), _to(starts_list, device)
            rows = torch.arange(len(work), device=device)
            q_row = rows.repeat_interleave(takes)
            q_first = torch.cumsum(takes, 0) - takes
            q_pos = torch.arange(len(q_row), device=device) - q_first[q_row] + starts[q_row]
            k_row = rows.repeat_interleave(lengths)
            k_first = torch.cumsum(lengths, 0) - lengths
            k_pos = torch.arange(len(k_row), device=device) - k_first[k_row]
            slots = table[k_row, k_pos // bs] * bs + k_pos % bs
            unique, column = torch.unique(slots, return_inverse=True)
            # Keys are already rotated (RoPE) in the cache, so their order in the product is
            # free.
            pair = (q_row[:, None] == k_row[None, :]) & (k_pos[None, :] <= q_pos[:, None])
            union = torch.zeros((len(q_row), len(unique)), dtype=torch.uint8, device=device)
            union.scatter_reduce_(1, column.expand(len(q_row), -1), pair.to(torch.uint8), "amax")
            read = unique[None]
            write = (table[q_row, q_pos // bs] * bs + q_pos % bs)[None]
            positions = q_pos[None]
            allowed = union.bool()[None, None]
            keep = torch.cumsum(takes, 0) - 1
        embeds = self._media_embeddings(ids, work, packed=not padded)
        mask: torch.Tensor = allowed
        if self._attention == "eager":
            mask = torch.zeros(allowed.shape, dtype=self._dtype, device=device).masked_fill_(
                ~allowed, torch.finfo(self._dtype).min
            )
        tokens: dict[str, torch.Tensor] = (
            {"input_ids": ids} if embeds is None else {"inputs_embeds": embeds}
        )
        out = self.model(
            **tokens,
            attention_mask=mask,
            position_ids=positions,
            cache=self._cache.point(write=write, read=read),
            use_cache=True,
            logits_to_keep=keep,
        )
        if isinstance(keep, int):
            logits = out.logits[:, -1]
        elif out.logits.shape[1] == keep.shape[0]:
            logits = out.logits[0]
        else:  # a model that ignores logits_to_keep (Qwen2-Audio) gives every position back
            logits = out.logits[0, keep]
        if self._vocab_size > self._tokenizer_size:
            # Padded embedding rows have no token behind them.
            logits[:, self._tokenizer_size :] = float("-inf")
        return logits

    def _media_embeddings(
        self, ids: torch.Tensor, work: list[tuple[Sequence, int]], *, packed: bool
    ) -> torch.Tensor | None:
        """Input embeddings with the placeholders of this step's media replaced by their
        features; None when no scheduled piece covers a placeholder (text stays on input_ids).

        A prompt split across steps takes the slice of each media's features its piece covers;
        a media's features are computed once per request, when a piece first needs them.
        """
        pieces: list[tuple[int, int, torch.Tensor]] = []
        offset = 0
        for row, (seq, take) in enumerate(work):
            lo, hi = seq.computed, seq.computed + take
            for index, media in enumerate(seq.owner.request.media):
                a, b = max(lo, media.start), min(hi, media.start + media.length)
                if a >= b:
                    continue
                features = seq.owner.features.get(index)
                if features is None:
                    if self._media is None:  # _invalid refuses media without a processor
                        raise RuntimeError("media without an encoder")
                    features = seq.owner.features[index] = self._media.encode(media)
                at = (0, offset + a - lo) if packed else (row, 0)
                pieces.append((*at, features[a - media.start : b - media.start]))
            offset += take
        if not pieces:
            return None
        embeds = self.model.get_input_embeddings()(ids)
        for row, col, features in pieces:
            embeds[row, col : col + features.shape[0]] = features.to(embeds.device, embeds.dtype)
        return embeds

    # -- sampling and appending -------------------------------------------------------------

    def _sample(
        self, logits: torch.Tensor, sequences: list[Sequence], failed: Failed
    ) -> list[int | None]:
        samplings = [s.sampling for s in sequences]
        histories = [s.tokens for s in sequences]
        try:
            return list(sample(logits, samplings, histories))
        except Exception as exc:
            logger.warning("batched sampling failed (%s); sampling row by row", type(exc).__name__)
        tokens: list[int | None] = []
        for i, seq in enumerate(sequences):  # find the row that raised
            try:
                tokens.append(
                    sample(logits[i : i + 1], samplings[i : i + 1], histories[i : i + 1])[0]
                )
            except Exception as exc:
                logger.error("sampling failed for a sequence: %s", type(exc).__name__)
                failed.add(seq.owner)
                tokens.append(None)
        return tokens

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


def _decode_padded(
    tables: list[list[int]], lengths: list[int], block_size: int, key_width: float
) -> bool:
    """Whether decoding rows are cheaper padded to the longest row than packed over the union
    of their slots.

    Per query, the packed product visits every distinct slot (a multiply-add per head and
    dimension, and a mask entry), the padded one gathers and reads its row's slots padded to
    the longest. Measured on CPU (engine runs of the tiny and bench demo models), a (query,
    slot) pair of the packed product costs about half of one gathered element, so the padded
    layout wins when the distinct slots outnumber the longest row `key_width / 2` times
    (`key_width`: key elements per query head, head_dim x kv_heads / heads): 32 rows of mixed
    lengths with 16-wide heads go padded (1.3x the engine's rate on the tiny model), with
    64-wide heads they stay packed (padded was 0.84x on the bench model), and so do rows
    sharing a prompt.
    """
    distinct = {
        block
        for table, length in zip(tables, lengths, strict=True)
        for block in table[: math.ceil(length / block_size)]
    }
    return 2 * len(distinct) * block_size > max(lengths) * key_width


def _to(values: list[Any], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)


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
