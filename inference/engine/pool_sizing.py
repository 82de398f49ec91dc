"""The key/value pool's geometry and size for a model: what its layers cache, and how many
blocks of it the memory takes.

The shape is read from a one-token forward, not from the config (`probe`); the size is
`max_num_blocks` or `kv_cache_bytes` where given, else on CUDA a share of the memory free
after the weights, else (CPU) every row at full context up to a cap (`num_blocks`). The
model runner (runner.py) builds the pool (kv.py) from these.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from . import attention as paged

# Without a GPU (or an explicit size), the key/value memory holds every row at full context,
# up to this many bytes.
_CPU_KV_BYTES = 2 * 1024**3
# On a GPU, the share of the memory free after the weights that keys and values may take; the
# rest is left to activations (the gathered context of one layer at a time, and logits).
_GPU_MEMORY_FRACTION = 0.85


def num_blocks(
    block_bytes: int,
    *,
    kv_cache_bytes: int | None,
    block_size: int,
    max_batch_size: int,
    context_length: int,
    layers: int,
    device: torch.device,
) -> int:
    """Blocks of `block_bytes` in `kv_cache_bytes`, or where it is None, in the device's
    default (see `_default_kv_bytes`)."""
    if kv_cache_bytes is None:
        everything = max_batch_size * context_length * (block_bytes // block_size)
        kv_cache_bytes = _default_kv_bytes(everything, layers, device)
    return kv_cache_bytes // block_bytes


def _default_kv_bytes(everything: int, layers: int, device: torch.device) -> int:
    """`everything`: the bytes of every row at full context."""
    if device.type != "cuda":
        return min(everything, _CPU_KV_BYTES)
    free, _ = torch.cuda.mem_get_info(device)
    # Attention gathers one layer's context at a time: 1/layers of the memory on top.
    usable = int(free * _GPU_MEMORY_FRACTION * layers / (layers + 1))
    return min(everything, usable)


def probe(model: Any, text: Any, device: torch.device) -> tuple[int, int, paged.Probed]:
    """(key/value heads, head dim, what the probe found: whether the paged attention reaches
    every layer, and the layers' windows), read from a one-token forward: the config does not
    say the shape alike in every family (Falcon's multi-query attention caches one head and has
    no `num_key_value_heads`; with its new decoder architecture it caches every query head
    whatever `num_kv_heads` says), nor whether the family's attention dispatches through
    transformers' interface, nor which layers have a window (Qwen2 and Gemma name one in the
    config and keep full layers beside it)."""

    def forward() -> DynamicCache:
        cache = DynamicCache()
        model(
            input_ids=torch.zeros((1, 1), dtype=torch.long, device=device),
            cache=cache,
            use_cache=True,
        )
        return cache

    with torch.inference_mode():
        cache, probed = paged.probe(model, text, forward)
    layers = text.num_hidden_layers
    # A linear-attention layer (hybrid models) caches no keys.
    cached = [k for k in (getattr(layer, "keys", None) for layer in cache.layers) if k is not None]
    shapes = {(keys.shape[1], keys.shape[3]) for keys in cached}  # [1, heads, 1, head dim]
    if len(cached) != layers or len(shapes) != 1:
        raise ValueError(
            "models whose layers do not all cache keys and values of one shape are not supported"
        )
    kv_heads, head_dim = shapes.pop()
    return int(kv_heads), int(head_dim), probed
