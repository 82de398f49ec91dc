"""Continuous batching over a transformers causal LM.

Up to `max_batch_size` sequences are in flight. Each step is one forward over all of them (one
new token each); a sequence that finishes leaves at once and the next request is pulled from the
caller's iterator, prefilled straight into the freed row of the key/value store (kv.py) and
decodes with the others from the next step on. Nobody waits for the slowest row of a batch.

Prompts that share a long prefix with a sequence already in the store (a common system prompt,
the n choices of one request) copy that prefix's keys and values instead of recomputing them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .kv import SlotKV
from .sampling import RowSampling, row_sampling, sample
from .types import (
    ERROR_CONTEXT_LENGTH,
    ERROR_INVALID_REQUEST,
    FINISH_LENGTH,
    FINISH_STOP,
    Choice,
    GenerationRequest,
    GenerationResult,
)

_SUPPORTED_ATTENTION = ("sdpa", "eager")


@dataclass(eq=False)
class _Request:
    request: GenerationRequest
    choices: dict[int, Choice] = field(default_factory=dict)
    busy: float = 0.0
    cached_tokens: int = 0
    primary_row: int = -1  # row of choice 0 while being admitted
    reported: bool = False

    @property
    def prompt(self) -> list[int]:
        return self.request.prompt_ids

    @property
    def n(self) -> int:
        return self.request.params.n


@dataclass(eq=False)
class _Sequence:
    owner: _Request
    choice: int
    sampling: RowSampling
    start: int  # first column of this row's tokens in the store
    tokens: list[int] = field(default_factory=list)


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
        prefill_chunk_tokens: int = 2048,
        min_prefix_reuse: int = 32,
    ) -> None:
        config = model.config
        attention = getattr(config, "_attn_implementation", "sdpa")
        if attention not in _SUPPORTED_ATTENTION:
            raise ValueError(f"attention {attention!r} is not supported; load with sdpa or eager")
        window = getattr(config, "sliding_window", None)
        if window and getattr(config, "use_sliding_window", True) and window < context_length:
            # The store keeps every column; a sliding window shorter than the context would
            # need its own mask per layer.
            raise ValueError(
                "models with a sliding window shorter than the context are not supported"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.max_batch_size = max_batch_size
        self.abort_poll_seconds = abort_poll_seconds
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.min_prefix_reuse = max(1, min_prefix_reuse)
        self.eos_token_ids = frozenset(
            eos_token_ids if eos_token_ids is not None else _model_eos_ids(model, tokenizer)
        )
        self.busy_seconds_total = 0.0  # over the engine's life; the results' shares sum to it
        self._attention = attention
        self._num_layers = config.get_text_config(decoder=True).num_hidden_layers
        self._device = model.get_input_embeddings().weight.device
        self._dtype = model.get_input_embeddings().weight.dtype
        self._vocab_size = model.get_output_embeddings().weight.shape[0]
        self._tokenizer_size = len(tokenizer)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    # -- the loop --------------------------------------------------------------------------

    def generate(
        self,
        requests: Iterable[GenerationRequest],
        *,
        aborted: Callable[[], Collection[str]] | None = None,
    ) -> Iterator[GenerationResult]:
        """Pulls requests lazily from `requests` as capacity frees up (continuous batching),
        yields each result as soon as it finishes (not in input order).

        At most `max_batch_size` sequences (n per request) are in flight, plus one request
        waiting for room when its n does not fit yet. `aborted()` is polled about every
        `abort_poll_seconds` of work; requests whose id it returns are stopped and yielded with
        aborted=True. Invalid requests (context_length_exceeded, invalid_request) are yielded
        immediately as error results without generation.
        """
        source = iter(requests)
        store = SlotKV(
            num_layers=self._num_layers,
            max_rows=self.max_batch_size,
            max_capacity=2 * self.context_length,
        )
        rows: list[_Sequence] = []
        waiting: deque[_Request] = deque()
        exhausted = False
        aborted_ids: frozenset[str] = frozenset()
        work_since_poll = float("inf")

        while True:
            if (
                aborted is not None
                and (rows or waiting)
                and work_since_poll >= self.abort_poll_seconds
            ):
                aborted_ids = frozenset(aborted())
                work_since_poll = 0.0
                yield from self._abort(store, rows, waiting, aborted_ids)

            free = self.max_batch_size - len(rows) - sum(r.n for r in waiting)
            while free > 0 and not exhausted:
                try:
                    request = next(source)
                except StopIteration:
                    exhausted = True
                    break
                error = self._invalid(request)
                if error or request.id in aborted_ids:
                    yield _empty_result(_Request(request), error=error, aborted=not error)
                    continue
                waiting.append(_Request(request))
                free -= request.params.n

            joining: list[_Request] = []
            room = self.max_batch_size - len(rows)
            while waiting and waiting[0].n <= room:
                room -= waiting[0].n
                joining.append(waiting.popleft())
            if joining:
                began = time.perf_counter()
                first_new = len(rows)
                with torch.inference_mode():
                    done = self._admit(store, rows, joining)
                spent = self._account(began, rows[first_new:] + done)
                work_since_poll += spent
                yield from self._results(done)

            if not rows:
                if exhausted and not waiting:
                    return
                continue

            began = time.perf_counter()
            stepping = list(rows)
            with torch.inference_mode():
                done = self._decode(store, rows)
            work_since_poll += self._account(began, stepping)
            yield from self._results(done)

    def _account(self, began: float, sequences: list[_Sequence]) -> float:
        spent = time.perf_counter() - began
        self.busy_seconds_total += spent
        share = spent / len(sequences)
        for seq in sequences:
            seq.owner.busy += share
        return spent

    def _results(self, finished: list[_Sequence]) -> Iterator[GenerationResult]:
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
        if len(request.prompt_ids) + p.max_new_tokens > self.context_length:
            return ERROR_CONTEXT_LENGTH
        return None

    def _abort(
        self, store: SlotKV, rows: list[_Sequence], waiting: deque[_Request], ids: frozenset[str]
    ) -> Iterator[GenerationResult]:
        if not ids:
            return
        owners: dict[int, _Request] = {}
        for seq in rows:
            if seq.owner.request.id in ids:
                owners[id(seq.owner)] = seq.owner
        with torch.inference_mode():  # the store's buffers are inference tensors
            self._retire(store, rows, {i for i, s in enumerate(rows) if id(s.owner) in owners})
        for request in [r for r in waiting if r.request.id in ids]:
            waiting.remove(request)
            owners[id(request)] = request
        for owner in owners.values():
            yield _empty_result(owner, aborted=True)

    # -- admission: prefill joining requests into free rows ----------------------------------

    def _admit(
        self, store: SlotKV, rows: list[_Sequence], joining: list[_Request]
    ) -> list[_Sequence]:
        longest = max(len(r.prompt) for r in joining)
        if store.write < longest:
            self._relayout(store, rows, new_write=longest)
        write = store.write

        # Plan: a request copies the longest prefix it shares with a prompt already in the store
        # or admitted before it here; the others are prefilled together.
        candidates: list[tuple[list[int], _Sequence | _Request]] = [
            (s.owner.prompt, s) for s in rows if s.choice == 0
        ]
        fresh: list[_Request] = []
        reusing: list[tuple[_Request, _Sequence | _Request, int]] = []
        for request in joining:
            best, source = 0, None
            for prompt, candidate in candidates:
                shared = _common_prefix(prompt, request.prompt, len(request.prompt) - 1)
                if shared > best:
                    best, source = shared, candidate
            if source is not None and best >= self.min_prefix_reuse:
                request.cached_tokens = best
                reusing.append((request, source, best))
            else:
                fresh.append(request)
            candidates.append((request.prompt, request))

        fresh.sort(key=lambda r: len(r.prompt))
        first_new = len(rows)
        for request in fresh + [r for r, _, _ in reusing]:
            request.primary_row = len(rows)
            rows.append(self._sequence(request, 0, start=write - len(request.prompt)))
        logits: dict[int, torch.Tensor] = {}

        chunk: list[_Request] = []
        for request in fresh:
            if chunk and (len(chunk) + 1) * len(request.prompt) > self.prefill_chunk_tokens:
                logits.update(self._prefill(store, chunk))
                chunk = []
            chunk.append(request)
        if chunk:
            logits.update(self._prefill(store, chunk))

        for request, source, shared in reusing:
            src = source if isinstance(source, _Sequence) else rows[source.primary_row]
            seq = rows[request.primary_row]
            store.copy_columns(
                src=rows.index(src),
                dst=request.primary_row,
                lo=src.start,
                hi=src.start + shared,
                to=seq.start,
            )
            logits[id(request)] = self._extend(
                store, request.primary_row, seq.start, shared, request.prompt
            )

        for request in joining:
            for choice in range(1, request.n):
                seq = self._sequence(request, choice, start=write - len(request.prompt))
                store.copy_columns(
                    src=request.primary_row, dst=len(rows), lo=seq.start, hi=write, to=seq.start
                )
                rows.append(seq)

        new = rows[first_new:]
        batch_logits = torch.stack([logits[id(seq.owner)] for seq in new])
        tokens = sample(batch_logits, [s.sampling for s in new], [s.tokens for s in new])
        return self._advance(store, rows, first_new, tokens)

    def _sequence(self, request: _Request, choice: int, *, start: int) -> _Sequence:
        sampling = row_sampling(
            request.request.params,
            choice=choice,
            eos_ids=sorted(self.eos_token_ids),
            vocab_size=self._vocab_size,
            device=self._device,
            tokenizer=self.tokenizer,  # hook (chat surface): grammar matchers, token bytes
        )
        return _Sequence(owner=request, choice=choice, sampling=sampling, start=start)

    def _prefill(self, store: SlotKV, chunk: list[_Request]) -> dict[int, torch.Tensor]:
        """One forward over whole prompts, left-padded into consecutive rows."""
        width = max(len(r.prompt) for r in chunk)
        first = chunk[0].primary_row
        write = store.write
        ids = torch.full((len(chunk), width), self._pad_id, dtype=torch.long)
        positions = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, request in enumerate(chunk):
            p = len(request.prompt)
            ids[i, width - p :] = torch.tensor(request.prompt)
            positions[i, width - p :] = torch.arange(p)
        pad = width - torch.tensor([len(r.prompt) for r in chunk])
        q = torch.arange(width)
        allowed = (q[None, :] <= q[:, None])[None] & (q[None, None, :] >= pad[:, None, None])
        # A padding query sees itself only: a fully masked row would produce NaN with eager.
        allowed |= torch.eye(width, dtype=torch.bool)[None]
        cache = store.window(
            rows=(first, first + len(chunk)), past=write - width, write_at=write - width
        )
        out = self._forward(ids, positions, allowed[:, None], cache)
        return {id(r): out[i] for i, r in enumerate(chunk)}

    def _extend(
        self, store: SlotKV, row: int, start: int, cached: int, prompt: list[int]
    ) -> torch.Tensor:
        """Prefill the part of one prompt after its reused prefix."""
        p = len(prompt)
        ids = torch.tensor([prompt[cached:]])
        positions = torch.arange(cached, p)[None]
        allowed = torch.arange(p)[None, :] <= torch.arange(cached, p)[:, None]
        cache = store.window(rows=(row, row + 1), past=start, write_at=start + cached)
        return self._forward(ids, positions, allowed[None, None], cache)[0]

    # -- decoding ---------------------------------------------------------------------------

    def _decode(self, store: SlotKV, rows: list[_Sequence]) -> list[_Sequence]:
        if store.write >= store.capacity:
            self._relayout(store, rows, new_write=0)
        write = store.write
        starts = torch.tensor([s.start for s in rows])
        live_from = int(starts.min())
        allowed = torch.arange(live_from, write + 1)[None, :] >= starts[:, None]
        ids = torch.tensor([[s.tokens[-1]] for s in rows])
        cache = store.window(rows=(0, len(rows)), past=live_from, write_at=write)
        logits = self._forward(ids, (write - starts)[:, None], allowed[:, None, None], cache)
        store.write += 1
        tokens = sample(logits, [s.sampling for s in rows], [s.tokens for s in rows])
        return self._advance(store, rows, 0, tokens)

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Last-position logits ([rows, vocab]) of one forward over the cache window."""
        device = self._device
        mask = allowed.to(device)
        if self._attention == "eager":
            mask = torch.zeros(mask.shape, dtype=self._dtype, device=device).masked_fill_(
                ~mask, torch.finfo(self._dtype).min
            )
        out = self.model(
            input_ids=ids.to(device),
            attention_mask=mask,
            position_ids=positions.to(device),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1, :]
        if self._vocab_size > self._tokenizer_size:
            # Padded embedding rows have no token behind them.
            logits[:, self._tokenizer_size :] = float("-inf")
        return logits

    def _advance(
        self, store: SlotKV, rows: list[_Sequence], first: int, tokens: list[int]
    ) -> list[_Sequence]:
        """Append each row's new token; retire and return the rows that finished."""
        finished: list[_Sequence] = []
        dead: set[int] = set()
        for offset, token in enumerate(tokens):
            seq = rows[first + offset]
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
                continue
            if text is None:
                text = self.tokenizer.decode(seq.tokens, skip_special_tokens=True)
            seq.owner.choices[seq.choice] = Choice(
                index=seq.choice,
                token_ids=list(seq.tokens),
                text=text,
                finish_reason=reason,
                logprobs=seq.sampling.logprobs,  # hook (chat surface): recorded by sample()
            )
            finished.append(seq)
            dead.add(first + offset)
        self._retire(store, rows, dead)
        return finished

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

    # -- store housekeeping -----------------------------------------------------------------

    def _retire(self, store: SlotKV, rows: list[_Sequence], dead: set[int]) -> None:
        """Drop rows, filling the holes from the tail so the active rows stay contiguous."""
        if not dead:
            return
        keep = len(rows) - len(dead)
        holes = sorted(i for i in dead if i < keep)
        movers = [i for i in range(keep, len(rows)) if i not in dead]
        if movers:
            store.move_rows(src=movers, dst=holes, lo=min(rows[i].start for i in movers))
        for hole, mover in zip(holes, movers, strict=True):
            rows[hole] = rows[mover]
        del rows[keep:]

    def _relayout(self, store: SlotKV, rows: list[_Sequence], *, new_write: int) -> None:
        live_from = min((s.start for s in rows), default=store.write)
        new_write = max(new_write, store.write - live_from)
        shift = store.relayout(rows=len(rows), live_from=live_from, new_write=new_write)
        for seq in rows:
            seq.start += shift


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _empty_result(
    request: _Request, *, error: str | None = None, aborted: bool = False
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
