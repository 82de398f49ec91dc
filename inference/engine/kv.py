"""Paged key/value memory: fixed-size blocks handed out as tokens arrive, and a prefix cache.

Every layer keeps one tensor of `slots = blocks * block_size` rows of `[kv_heads, head_dim]`
for keys and one for values, allocated once for the engine's life. A sequence owns a list of
blocks (its block table); token `i` of the sequence lives in slot
`table[i // block_size] * block_size + i % block_size`. Blocks are reference counted: the `n`
choices of a request share the blocks of their prompt, and a full block whose tokens hash to
one already computed (same tokens, same prefix, same cache scope) is shared instead of
recomputed. A block written while shared is copied first (copy on write).

When its last holder lets it go, a block with a hash stays in the prefix cache (least recently
used first out) until its memory is needed; a block without one is free at once.

Block 0 is never handed out: reads past a row's length (masked) point there, and it is zeroed,
so every slot that enters an attention product holds finite numbers.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from .tables import DeviceTables


class BlockPool:
    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if num_blocks < 2:
            raise ValueError("the key/value memory must hold at least two blocks")
        self.num_blocks = num_blocks
        self.block_size = block_size
        slots = num_blocks * block_size
        # Empty, not zeros: only written slots (and block 0, zeroed here) are ever read.
        self.keys = [
            torch.empty((slots, kv_heads, head_dim), dtype=dtype, device=device)
            for _ in range(num_layers)
        ]
        self.values = [torch.empty_like(k) for k in self.keys]
        for buf in (*self.keys, *self.values):
            buf[:block_size].zero_()
        self.refs = [0] * num_blocks
        self.free: list[int] = list(range(num_blocks - 1, 0, -1))  # block 0 is the trash
        self.block_hash: dict[int, bytes] = {}
        self.by_hash: dict[bytes, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; LRU first
        self.held = 0  # blocks referenced by at least one table
        self.tables = DeviceTables(device)  # the tables' copy on the device (blocks.py)

    @property
    def available(self) -> int:
        """Blocks that can be handed out now (free, or cached and unreferenced)."""
        return len(self.free) + len(self.evictable)

    @property
    def capacity_tokens(self) -> int:
        return (self.num_blocks - 1) * self.block_size

    def allocate(self) -> int | None:
        if self.free:
            block = self.free.pop()
        elif self.evictable:
            block, _ = self.evictable.popitem(last=False)
            del self.by_hash[self.block_hash.pop(block)]
        else:
            return None
        self.refs[block] = 1
        self.held += 1
        return block

    def release(self, blocks: list[int]) -> None:
        for block in blocks:
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.held -= 1
                if block in self.block_hash:
                    self.evictable[block] = None
                else:
                    self.free.append(block)

    def share(self, block: int) -> None:
        if self.refs[block] == 0:
            del self.evictable[block]
            self.held += 1
        self.refs[block] += 1

    def lookup(self, digest: bytes) -> int | None:
        """A cached block holding exactly this prefix, now referenced by the caller."""
        block = self.by_hash.get(digest)
        if block is not None:
            self.share(block)
        return block

    def register(self, block: int, digest: bytes) -> None:
        """Offer a block that just became full to later prompts with the same prefix."""
        if digest not in self.by_hash and block not in self.block_hash:
            self.by_hash[digest] = block
            self.block_hash[block] = digest

    def copy_block(self, *, src: int, dst: int, tokens: int) -> None:
        bs = self.block_size
        for buf in (*self.keys, *self.values):
            buf[dst * bs : dst * bs + tokens] = buf[src * bs : src * bs + tokens]

    def clear_cache(self) -> None:
        """Forget every cached block (all of them must be unreferenced)."""
        while self.evictable:
            block, _ = self.evictable.popitem(last=False)
            del self.by_hash[self.block_hash.pop(block)]
            self.free.append(block)


def block_digest(parent: bytes, scope: str, tokens: list[int], media: bytes = b"") -> bytes:
    """Identity of a full block: its tokens, everything before them (via the parent's digest),
    the cache scope and the digests of the media whose placeholders it holds."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(scope.encode())
    h.update(b"\0")
    h.update(array("q", tokens).tobytes())
    if media:
        h.update(b"\1")
        h.update(media)
    return h.digest()


class PagedCache(Cache):
    """What the model's attention layers see during one forward.

    `write` (shaped like the forward's input ids) gives the slot of every new token. With
    `gather` (a model whose attention does not dispatch through transformers' interface),
    `read` (`[rows, keys]`) gives the slots of the keys each row attends to, padded with 0,
    gathered here for the model's own attention with the 4-D mask the runner passes; without
    it the layer gets its new keys and values back and the paged attention (attention.py)
    reads the pool itself.
    """

    def __init__(self, pool: BlockPool, *, gather: bool) -> None:
        self.pool = pool
        self.gather = gather
        self.write = torch.zeros((1, 1), dtype=torch.long)
        self.read = torch.zeros((1, 1), dtype=torch.long)
        super().__init__(layers=[_PagedLayer(self, i) for i in range(len(pool.keys))])

    def point(self, *, write: torch.Tensor, read: torch.Tensor) -> PagedCache:
        self.write, self.read = write, read
        return self


class _PagedLayer(DynamicLayer):
    def __init__(self, cache: PagedCache, layer: int) -> None:
        super().__init__()
        self.cache = cache
        self.layer = layer
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        pool, cache = self.cache.pool, self.cache
        keys, values = pool.keys[self.layer], pool.values[self.layer]
        _, heads, _, dim = key_states.shape
        slots = cache.write.reshape(-1)
        keys.index_copy_(0, slots, key_states.transpose(1, 2).reshape(-1, heads, dim))
        values.index_copy_(0, slots, value_states.transpose(1, 2).reshape(-1, heads, dim))
        if not cache.gather:
            return key_states, value_states
        # index_select is several times faster than advanced indexing here. The gathered
        # context is handed to attention as a strided view ([rows, heads, keys, dim] over a
        # [rows, keys, heads, dim] buffer): attention reads it as it is, and a contiguous copy
        # per layer per step cost as much again as the gather (1.6x the whole step on CPU).
        read = cache.read.reshape(-1)
        shape = (*cache.read.shape, heads, dim)  # [rows, keys, heads, dim]
        return (
            keys.index_select(0, read).view(shape).transpose(1, 2),
            values.index_select(0, read).view(shape).transpose(1, 2),
        )

    def get_seq_length(self) -> int:
        return 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return int(self.cache.read.shape[1]), 0

    def get_max_length(self) -> int:
        return -1
