"""Boardwalk's attention over the paged pool, run by the model through transformers'
`AttentionInterface`.

The runner registers `paged_attention` under `PAGED` and switches the model's text config to
it for the length of each of its forwards (the model keeps its own implementation for
everything else, `model.generate` included). Mask creation then steps aside (transformers
builds no mask for an implementation it does not know), and each layer calls this function
with its queries and what it passes along: `scaling`, `sliding_window`, `softcap`, `s_aux`
(attention sinks). The step's layout (`StepAttention`, built by the runner) says which pool
slots each row reads and which query may see which slot; this function reads those slots of
its layer straight from the pool, applies the layer's own window, and computes one product
for the whole step.

Two products, chosen by what the layer asks for:

- plain (no soft-capping, no sinks): PyTorch's SDPA, through transformers' own wrapper (its
  grouped-query handling), with a boolean mask;
- explicit (soft-capping, sinks): the product, the cap, the mask and the softmax written out
  in the order the families' own eager attention computes them, so they agree to rounding.

A model whose attention does not dispatch through the interface (Falcon builds its own) is
found out by `probe`: the runner then hands it gathered keys and values through its cache and
a mask, as before, and refuses sliding windows for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from .kv import BlockPool

PAGED = "boardwalk_paged"
_PROBE = "boardwalk_probe"


@dataclass
class StepAttention:
    """What every layer of one forward reads: `read` ([rows, keys]) the pool slots of each
    row's keys (a packed step has one row holding the union of its sequences' slots), and
    `allowed` ([rows, 1, queries, keys]) which query sees which of them (its own sequence,
    causal). `q_pos` ([rows, 1, queries, 1]) and `k_pos` ([rows or 1, 1, 1, keys]) are the
    positions within their sequences, for sliding windows; None when no layer has one."""

    pool: BlockPool
    read: torch.Tensor
    allowed: torch.Tensor
    q_pos: torch.Tensor | None = None
    k_pos: torch.Tensor | None = None
    _windowed: dict[int, torch.Tensor] = field(default_factory=dict)

    def mask(self, window: int | None) -> torch.Tensor:
        """The mask of a layer attending through `window` tokens (None: all of them), built
        once per step and window."""
        if not window or self.q_pos is None or self.k_pos is None:
            return self.allowed
        mask = self._windowed.get(window)
        if mask is None:
            # A key is in the window when fewer than `window` positions lie between it and
            # the query (transformers' sliding_window_overlay: kv > q - window).
            mask = self.allowed & (self.q_pos - self.k_pos < window)
            self._windowed[window] = mask
        return mask

    def context(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's keys and values of the step's slots, `[rows, kv heads, keys, dim]`.

        index_select is several times faster than advanced indexing here; the result goes to
        the product as a strided view of a `[rows, keys, heads, dim]` buffer (a contiguous copy
        per layer per step cost as much again as the gather on CPU).
        """
        keys, values = self.pool.keys[layer], self.pool.values[layer]
        flat = self.read.reshape(-1)
        shape = (*self.read.shape, keys.shape[1], keys.shape[2])
        return (
            keys.index_select(0, flat).view(shape).transpose(1, 2),
            values.index_select(0, flat).view(shape).transpose(1, 2),
        )


_step: ContextVar[StepAttention | None] = ContextVar("boardwalk_step", default=None)
# Layer index -> the sliding window it asked for (None: none), filled by the probe.
_probed: ContextVar[dict[int, int | None] | None] = ContextVar("boardwalk_probed", default=None)


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """One layer's attention over the step's slots of the pool (`key`/`value`, the new
    tokens', are already in it: the cache wrote them)."""
    step = _step.get()
    if step is None:
        raise RuntimeError("paged attention outside an engine step")
    keys, values = step.context(int(module.layer_idx))  # type: ignore[arg-type]
    mask = step.mask(sliding_window)
    if softcap is None and s_aux is None:
        out, _ = sdpa_attention_forward(
            module, query, keys, values, mask, dropout=0.0, scaling=scaling, is_causal=False
        )
        return out, None
    return explicit_attention(query, keys, values, mask, scaling, softcap, s_aux), None


def explicit_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Attention written out (`[batch, heads, queries, dim]` queries, `[batch, kv heads, keys,
    dim]` keys and values; `[batch, queries, heads, dim]` out): Gemma 2's soft-capping of the
    scores, GPT-OSS's sinks (one learned logit per head that takes a share of the softmax and
    no value)."""
    groups = query.shape[1] // keys.shape[1]
    keys, values = repeat_kv(keys, groups), repeat_kv(values, groups)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, keys.transpose(2, 3)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    if sinks is not None:
        sink = sinks.reshape(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)
        scores = torch.cat([scores, sink.to(scores.dtype)], dim=-1)
        scores = scores - scores.max(dim=-1, keepdim=True).values
        probs = torch.softmax(scores, dim=-1, dtype=scores.dtype)[..., :-1].to(values.dtype)
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(probs, values).transpose(1, 2).contiguous()


def _probe_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A one-token forward's attention (every key visible), noting which layer called it
    and the window it asked for."""
    called = _probed.get()
    if called is not None:
        layer = int(module.layer_idx)  # type: ignore[arg-type]
        called[layer] = kwargs.get("sliding_window") or None
    scaling, softcap, sinks = (kwargs.get(k) for k in ("scaling", "softcap", "s_aux"))
    return explicit_attention(query, key, value, None, scaling, softcap, sinks), None


AttentionInterface.register(PAGED, paged_attention)
AttentionInterface.register(_PROBE, _probe_attention)


@contextmanager
def implementation(config: Any, name: str) -> Iterator[None]:
    """Run the model with attention `name` inside the block (its text config only: a media
    model's encoders keep theirs)."""
    saved = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = saved


@contextmanager
def step(attention: StepAttention) -> Iterator[None]:
    token = _step.set(attention)
    try:
        yield
    finally:
        _step.reset(token)


@dataclass(frozen=True)
class Probed:
    """What a probing forward found: `routed`, whether every layer's attention went through
    the interface (so the paged function will reach it); `window`, the widest sliding window
    of the layers when every one of them has one (keys older than it are read by no layer
    again), else None."""

    routed: bool
    window: int | None


def probe(model: Any, config: Any, forward: Any) -> tuple[Any, Probed]:
    """Run `forward()` (a one-token forward) with the probing attention; returns its result
    and what it found. A model that fails under it is probed with its own attention instead
    (not routed, no window known)."""
    called: dict[int, int | None] = {}
    token = _probed.set(called)
    try:
        with implementation(config, _PROBE):
            out = forward()
    except Exception:
        return forward(), Probed(routed=False, window=None)
    finally:
        _probed.reset(token)
    routed = set(called) == set(range(config.num_hidden_layers))
    windows = [w for w in called.values() if w]
    every = routed and len(windows) == len(called)
    return out, Probed(routed=routed, window=max(windows) if every else None)
