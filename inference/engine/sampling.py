"""Next-token choice on a batch of logits, row by row independent of the rest of the batch.

Every sequence draws from its own `torch.Generator`, and a row's result depends only on its own
logits and parameters (rows with and without nucleus sampling take separate paths), so a seeded
request samples the same tokens whatever it shares a batch with.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .constraints import Constraint, TokenTable, allowed_tokens, mask_words, token_table
from .types import SamplingParams, TokenLogprob

# What a masked-out alternative reports as its log probability (JSON has no -Infinity).
_FLOOR_LOGPROB = -9999.0


@dataclass
class RowSampling:
    """The sampling state of one sequence."""

    temperature: float
    top_p: float
    generator: torch.Generator | None  # None when greedy
    presence_penalty: float
    frequency_penalty: float
    bias_ids: torch.Tensor | None
    bias_values: torch.Tensor | None
    banned_ids: tuple[int, ...] | None  # end-of-sequence ids under ignore_eos
    constraint: Constraint | None = None  # the grammar this row's output must match
    logprobs: list[TokenLogprob] | None = None  # filled by `sample` when asked for
    top_logprobs: int = 0
    table: TokenTable | None = None

    @property
    def plain(self) -> bool:
        """Greedy with nothing to adjust, mask or record: argmax alone (bans aside)."""
        return (
            self.temperature <= 0
            and self.bias_ids is None
            and not self.presence_penalty
            and not self.frequency_penalty
            and self.constraint is None
            and self.logprobs is None
        )

    @property
    def draws_only(self) -> bool:
        """Needs nothing per step but its logits and, when it samples, one draw from its
        generator (no bias, penalty, grammar or logprobs): what `RunSampler` serves."""
        return (
            self.bias_ids is None
            and not self.presence_penalty
            and not self.frequency_penalty
            and self.constraint is None
            and self.logprobs is None
        )


def row_sampling(
    params: SamplingParams,
    *,
    choice: int,
    eos_ids: Sequence[int],
    vocab_size: int,
    device,
    tokenizer: Any = None,
) -> RowSampling:
    """`tokenizer` is needed when the request has a constraint or asks for logprobs."""
    generator = None
    if params.temperature > 0:
        generator = torch.Generator()
        generator.manual_seed(_choice_seed(params.seed, choice))
    bias_ids = bias_values = banned = None
    bias = {t: b for t, b in params.logit_bias.items() if 0 <= t < vocab_size}
    if bias:
        bias_ids = torch.tensor(list(bias), dtype=torch.long, device=device)
        bias_values = torch.tensor(list(bias.values()), dtype=torch.float32, device=device)
    table = constraint = None
    if params.constraint is not None or params.logprobs:
        table = token_table(tokenizer, vocab_size, tuple(sorted(eos_ids)))
    if params.constraint is not None and table is not None:
        constraint = Constraint(params.constraint, table)
    if params.ignore_eos and eos_ids and constraint is None:
        # A constrained row must be able to end where its grammar does.
        banned = tuple(eos_ids)
    return RowSampling(
        temperature=params.temperature,
        top_p=params.top_p,
        generator=generator,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        bias_ids=bias_ids,
        bias_values=bias_values,
        banned_ids=banned,
        constraint=constraint,
        logprobs=[] if params.logprobs else None,
        top_logprobs=params.top_logprobs if params.logprobs else 0,
        table=table,
    )


def _choice_seed(seed: int | None, choice: int) -> int:
    if seed is None:
        return secrets.randbits(63)
    digest = hashlib.sha256(f"{seed}:{choice}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def sample(
    logits: torch.Tensor, rows: Sequence[RowSampling], histories: Sequence[list[int]]
) -> list[int]:
    """Choose one token per row of `logits` ([rows, vocab]); `histories` are the tokens generated
    so far (for the presence and frequency penalties).

    Rows with a constraint draw only among the tokens their grammar allows, and move their
    matcher past the chosen token; rows that asked for logprobs get them recorded, from the
    distribution drawn from. Rows with neither pay nothing for either.
    """
    logits = logits.float()
    vocab = logits.shape[-1]
    banned = [i for i, row in enumerate(rows) if row.banned_ids is not None]
    ban_rows = [i for i in banned for _ in rows[i].banned_ids or ()]
    ban_ids = [t for i in banned for t in rows[i].banned_ids or ()]
    constrained: list[int] = []
    plain: list[int] = []
    nucleus: list[int] = []
    recording: list[int] = []
    # Plain greedy rows (the usual batch row) need nothing but the argmax: the rest, one pass.
    for i in [i for i, row in enumerate(rows) if not row.plain]:
        row = rows[i]
        if row.bias_ids is not None and row.bias_values is not None:
            logits[i].index_add_(0, row.bias_ids, row.bias_values)
        if (row.presence_penalty or row.frequency_penalty) and histories[i]:
            seen = torch.tensor(histories[i], device=logits.device)
            counts = torch.bincount(seen, minlength=vocab)[:vocab].to(logits.dtype)
            logits[i] -= row.frequency_penalty * counts + row.presence_penalty * (counts > 0)
        if row.constraint is not None:
            constrained.append(i)
        if row.temperature > 0:
            (plain if row.top_p >= 1 else nucleus).append(i)
        if row.logprobs is not None:
            recording.append(i)
    if ban_rows:  # one write for every banned end token of every row
        logits[_index(ban_rows, logits.device), _index(ban_ids, logits.device)] = float("-inf")
    if constrained:
        _mask(logits, [rows[i] for i in constrained], constrained)

    chosen = logits.argmax(dim=-1)
    for subset, use_top_p in ((plain, False), (nucleus, True)):
        if subset:
            index = _index(subset, logits.device)
            picked = _draw(logits[index], [rows[i] for i in subset], use_top_p)
            chosen[index] = picked
    tokens: list[int] = chosen.tolist()
    for i in recording:
        _record_logprobs(rows[i], logits[i], tokens[i])
    for i in constrained:
        constraint = rows[i].constraint
        if constraint is not None:
            constraint.advance(tokens[i])
    return tokens


class RunSampler:
    """The next tokens of the same rows over up to `steps` steps (a decoding run, runs.py),
    each step's what `sample` would choose, without a Python pass over the rows a step.

    Rows must be `draws_only`. The bans become one index, built once; greedy rows take the
    argmax; sampling rows take their draws from their generators up front (`torch.rand(k)`
    gives the k values, and leaves the state, that k calls of `torch.rand(1)` would), and
    `rewind` puts each generator where those steps alone would have left it when the run
    ends early, so a seeded row samples the same tokens however its steps were grouped.
    """

    def __init__(self, rows: Sequence[RowSampling], steps: int, device: torch.device) -> None:
        banned = [i for i, row in enumerate(rows) if row.banned_ids is not None]
        self._ban = (
            _index([i for i in banned for _ in rows[i].banned_ids or ()], device),
            _index([t for i in banned for t in rows[i].banned_ids or ()], device),
        )
        self._steps = steps
        self._states: list[tuple[torch.Generator, torch.Tensor]] = []
        self._subsets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]]
        self._subsets = []
        drawing = [i for i, row in enumerate(rows) if row.temperature > 0]
        for nucleus in (False, True):
            subset = [i for i in drawing if (rows[i].top_p < 1) == nucleus]
            if not subset:
                continue
            draws = []
            for i in subset:
                generator = rows[i].generator
                if generator is None:  # every sampling row has one (row_sampling)
                    raise ValueError("a sampling row without a generator")
                self._states.append((generator, generator.get_state()))
                draws.append(torch.rand(steps, generator=generator))
            top_p = (
                torch.tensor([rows[i].top_p for i in subset], device=device) if nucleus else None
            )
            self._subsets.append(
                (
                    _index(subset, device),
                    torch.tensor([rows[i].temperature for i in subset], device=device),
                    top_p,
                    torch.stack(draws).to(device),
                )
            )

    def choose(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        """Step `step`'s tokens ([rows], on the device) from its logits ([rows, vocab])."""
        logits = logits.float()
        if self._ban[0].numel():
            logits[self._ban] = float("-inf")
        chosen = logits.argmax(dim=-1)
        for index, temperature, top_p, draws in self._subsets:
            chosen[index] = _pick(logits[index], temperature, top_p, draws[:, step])
        return chosen

    def rewind(self, used: int) -> None:
        """The run took `used` steps: leave each generator as `used` draws would have."""
        if used == self._steps:
            return
        for generator, state in self._states:
            generator.set_state(state)
            if used:
                torch.rand(used, generator=generator)


def _mask(logits: torch.Tensor, rows: list[RowSampling], index: list[int]) -> None:
    vocab = logits.shape[-1]
    bitmask = torch.full((len(rows), mask_words(vocab)), -1, dtype=torch.int32)
    for j, row in enumerate(rows):
        if row.constraint is not None:
            row.constraint.fill(bitmask, j)
    allowed = allowed_tokens(bitmask, vocab, logits.device)
    where = torch.tensor(index, device=logits.device)
    logits[where] = logits[where].masked_fill(~allowed, float("-inf"))


def _record_logprobs(row: RowSampling, logits: torch.Tensor, token: int) -> None:
    """Log probabilities under the distribution drawn from: the processed logits over the
    temperature (greedy rows: temperature 1), before any nucleus cut."""
    if row.logprobs is None or row.table is None:
        return
    scaled = logits / row.temperature if row.temperature > 0 else logits
    logprobs = torch.log_softmax(scaled, dim=-1)
    top: list[tuple[int, bytes, float]] = []
    if row.top_logprobs:
        values, ids = logprobs.topk(min(row.top_logprobs, logprobs.shape[-1]))
        for value, token_id in zip(values.tolist(), ids.tolist(), strict=True):
            if value == float("-inf"):
                break  # masked out: not an alternative the row could have drawn
            top.append((token_id, row.table.token(token_id)[0], max(value, _FLOOR_LOGPROB)))
    token_bytes, special = row.table.token(token)
    row.logprobs.append(
        TokenLogprob(
            token_id=token,
            token=token_bytes,
            special=special,
            logprob=max(float(logprobs[token]), _FLOOR_LOGPROB),
            top=top,
        )
    )


def _draw(logits: torch.Tensor, rows: list[RowSampling], use_top_p: bool) -> torch.Tensor:
    temperature = torch.tensor([r.temperature for r in rows], device=logits.device)
    top_p = torch.tensor([r.top_p for r in rows], device=logits.device) if use_top_p else None
    draws = torch.cat([torch.rand(1, generator=r.generator) for r in rows]).to(logits.device)
    return _pick(logits, temperature, top_p, draws)


def _pick(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor | None,
    draws: torch.Tensor,
) -> torch.Tensor:
    """Each row's token at its uniform draw in `draws` (one per row) through the cumulative
    distribution of its logits over its temperature, cut to its nucleus when `top_p` is
    given."""
    probs = torch.softmax(logits / temperature[:, None], dim=-1)
    order = None
    if top_p is not None:
        probs, order = probs.sort(dim=-1, descending=True, stable=True)
        # Keep the smallest head whose mass reaches top_p (the token that crosses it included).
        probs = probs.masked_fill((probs.cumsum(dim=-1) - probs) > top_p[:, None], 0.0)
    cumulative = probs.cumsum(dim=-1)
    targets = draws * cumulative[:, -1]
    picked = torch.searchsorted(cumulative, targets[:, None], right=True).clamp_(
        max=probs.shape[-1] - 1
    )
    if order is not None:
        picked = order.gather(1, picked)
    return picked[:, 0]


def _index(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)
