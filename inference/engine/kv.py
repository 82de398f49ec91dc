"""The key/value store behind continuous batching.

Every layer keeps one preallocated tensor `[rows, kv_heads, capacity, head_dim]` for keys and one
for values. Sequences in flight occupy rows `0..n-1` (a finished row is refilled from the tail,
so the active rows stay contiguous) and are right-aligned: all of them write their next token at
the same column `write`, and a row's tokens fill the columns `[start, write)`. Columns left of a
row's start are padding that its attention mask hides.

So a decode step is one forward over a view of the buffers, writing one column in place, and a
joining sequence is prefilled straight into a free row: no cache is ever concatenated or
re-batched as membership changes. When `write` reaches the capacity, the live window is moved
back to column 0 (or the buffers grow); that copy is rare and amortised.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

# Free columns kept to the right of the live window after a relayout, so that steps go on
# for a while before the next one.
_MIN_HEADROOM = 64


class SlotKV:
    def __init__(self, *, num_layers: int, max_rows: int, max_capacity: int) -> None:
        self.num_layers = num_layers
        self.max_rows = max_rows
        self.max_capacity = max_capacity
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.capacity = 0
        self.write = 0  # the column every active row writes next
        # The window of the next forward: rows [row_lo, row_hi), past columns [past, write_at),
        # new columns from write_at on.
        self.row_lo = self.row_hi = self.past = self.write_at = 0
        self.cache = _WindowCache(self)

    def window(self, *, rows: tuple[int, int], past: int, write_at: int) -> Cache:
        """Point the cache at a block of rows and columns; return it for `model(cache=...)`."""
        self.row_lo, self.row_hi = rows
        self.past, self.write_at = past, write_at
        return self.cache

    def allocate_layer(self, layer: int, like: torch.Tensor) -> None:
        # Zeros, not empty: masked columns still enter the attention product with weight 0,
        # and 0 * NaN from uninitialised memory would poison the row.
        shape = (self.max_rows, like.shape[1], self.capacity, like.shape[3])
        self.keys[layer] = torch.zeros(shape, dtype=like.dtype, device=like.device)
        self.values[layer] = torch.zeros(shape, dtype=like.dtype, device=like.device)

    def relayout(self, *, rows: int, live_from: int, new_write: int) -> int:
        """Move columns `[live_from, write)` of rows `[0, rows)` to end at `new_write`.

        Grows the buffers when `new_write` leaves too little room. Returns the shift applied to
        every column index (the caller moves its row starts by it).
        """
        shift = new_write - self.write
        new_capacity = self.capacity
        if self.capacity - new_write < max(_MIN_HEADROOM, new_write // 2):
            wanted = min(max(2 * new_write, new_write + _MIN_HEADROOM), self.max_capacity)
            new_capacity = max(self.capacity, wanted, new_write + 1)
        for store in (self.keys, self.values):
            for layer, old in enumerate(store):
                if old is None:
                    continue
                live = old[:rows, :, live_from : self.write]
                if new_capacity != self.capacity:
                    new = old.new_zeros((old.shape[0], old.shape[1], new_capacity, old.shape[3]))
                    new[:rows, :, live_from + shift : new_write] = live
                    store[layer] = new
                elif shift:
                    old[:rows, :, live_from + shift : new_write] = live.clone()
        self.capacity = new_capacity
        self.write = new_write
        return shift

    def copy_columns(self, *, src: int, dst: int, lo: int, hi: int, to: int) -> None:
        """Copy columns `[lo, hi)` of row `src` to row `dst`, starting at column `to`."""
        for store in (self.keys, self.values):
            for buf in store:
                if buf is not None:
                    buf[dst, :, to : to + hi - lo] = buf[src, :, lo:hi]

    def move_rows(self, *, src: list[int], dst: list[int], lo: int) -> None:
        """Copy the live columns `[lo, write)` of rows `src` onto rows `dst` (compaction)."""
        if not src:
            return
        for store in (self.keys, self.values):
            for buf in store:
                if buf is not None:
                    src_t = torch.tensor(src, device=buf.device)
                    dst_t = torch.tensor(dst, device=buf.device)
                    buf[dst_t, :, lo : self.write] = buf[src_t, :, lo : self.write]


class _WindowLayer(DynamicLayer):
    """One layer's view of the store: writes new keys/values in place, returns the window."""

    def __init__(self, store: SlotKV, layer: int) -> None:
        super().__init__()
        self.store = store
        self.layer = layer
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.store
        if s.keys[self.layer] is None:
            s.allocate_layer(self.layer, key_states)
        keys, values = s.keys[self.layer], s.values[self.layer]
        if keys is None or values is None:
            raise RuntimeError(f"layer {self.layer} has no buffer after allocation")
        end = s.write_at + key_states.shape[-2]
        keys[s.row_lo : s.row_hi, :, s.write_at : end] = key_states
        values[s.row_lo : s.row_hi, :, s.write_at : end] = value_states
        return (
            keys[s.row_lo : s.row_hi, :, s.past : end],
            values[s.row_lo : s.row_hi, :, s.past : end],
        )

    def get_seq_length(self) -> int:
        return self.store.write_at - self.store.past

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1


class _WindowCache(Cache):
    def __init__(self, store: SlotKV) -> None:
        super().__init__(layers=[_WindowLayer(store, i) for i in range(store.num_layers)])
