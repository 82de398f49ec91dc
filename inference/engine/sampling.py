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

import torch

from .types import SamplingParams


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
    banned_ids: torch.Tensor | None  # end-of-sequence ids under ignore_eos


def row_sampling(
    params: SamplingParams, *, choice: int, eos_ids: Sequence[int], vocab_size: int, device
) -> RowSampling:
    generator = None
    if params.temperature > 0:
        generator = torch.Generator()
        generator.manual_seed(_choice_seed(params.seed, choice))
    bias_ids = bias_values = banned = None
    bias = {t: b for t, b in params.logit_bias.items() if 0 <= t < vocab_size}
    if bias:
        bias_ids = torch.tensor(list(bias), dtype=torch.long, device=device)
        bias_values = torch.tensor(list(bias.values()), dtype=torch.float32, device=device)
    if params.ignore_eos and eos_ids:
        banned = torch.tensor(list(eos_ids), dtype=torch.long, device=device)
    return RowSampling(
        temperature=params.temperature,
        top_p=params.top_p,
        generator=generator,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        bias_ids=bias_ids,
        bias_values=bias_values,
        banned_ids=banned,
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
    so far (for the presence and frequency penalties)."""
    logits = logits.float()
    vocab = logits.shape[-1]
    for i, row in enumerate(rows):
        if row.bias_ids is not None and row.bias_values is not None:
            logits[i].index_add_(0, row.bias_ids, row.bias_values)
        if (row.presence_penalty or row.frequency_penalty) and histories[i]:
            seen = torch.tensor(histories[i], device=logits.device)
            counts = torch.bincount(seen, minlength=vocab)[:vocab].to(logits.dtype)
            logits[i] -= row.frequency_penalty * counts + row.presence_penalty * (counts > 0)
        if row.banned_ids is not None:
            logits[i, row.banned_ids] = float("-inf")

    chosen = logits.argmax(dim=-1)
    plain = [i for i, r in enumerate(rows) if r.temperature > 0 and r.top_p >= 1]
    nucleus = [i for i, r in enumerate(rows) if r.temperature > 0 and r.top_p < 1]
    for subset, use_top_p in ((plain, False), (nucleus, True)):
        if subset:
            index = torch.tensor(subset, device=logits.device)
            picked = _draw(logits[index], [rows[i] for i in subset], use_top_p)
            chosen[index] = picked
    return chosen.tolist()


def _draw(logits: torch.Tensor, rows: list[RowSampling], use_top_p: bool) -> torch.Tensor:
    temperature = torch.tensor([r.temperature for r in rows], device=logits.device)
    probs = torch.softmax(logits / temperature[:, None], dim=-1)
    order = None
    if use_top_p:
        probs, order = probs.sort(dim=-1, descending=True, stable=True)
        top_p = torch.tensor([r.top_p for r in rows], device=logits.device)
        # Keep the smallest head whose mass reaches top_p (the token that crosses it included).
        probs = probs.masked_fill((probs.cumsum(dim=-1) - probs) > top_p[:, None], 0.0)
    cumulative = probs.cumsum(dim=-1)
    draws = torch.cat([torch.rand(1, generator=r.generator) for r in rows]).to(logits.device)
    targets = draws * cumulative[:, -1]
    picked = torch.searchsorted(cumulative, targets[:, None], right=True).clamp_(
        max=probs.shape[-1] - 1
    )
    if order is not None:
        picked = order.gather(1, picked)
    return picked[:, 0]
