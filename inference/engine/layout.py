"""The packed layout of a step, built on the device from small index tensors.

A packed step runs every scheduled token as one `[1, tokens]` row. Its keys are the step's
distinct blocks, each slot once however many sequences read it (a shared prefix's blocks), and
a mask says which query sees which slot: its own sequence's keys up to its position. Keys are
already rotated (RoPE) in the pool, so their order in the product is free.

Everything here is computed from tensors of one entry per row, per query, or per query and
block of its own row, never per (query, key) pair or per (row, distinct block): the only tensor
as large as queries x keys is the mask itself, zeroed and then written one block row of flags
per (query, own block). The sizes the host already knows (the step's queries, its
distinct blocks) are passed in, so no op has to read a count back from the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Packed:
    """`read` ([1, keys]): the pool slot of each key column (a slot no row has reached reads
    the zeroed block 0); `write` and `positions` ([1, queries]): the slot and position of each
    new token; `allowed` ([1, 1, queries, keys]); `keep` ([rows]): each row's last query;
    `q_pos`/`k_pos`: positions within their sequences for sliding windows (None without)."""

    read: torch.Tensor
    write: torch.Tensor
    positions: torch.Tensor
    allowed: torch.Tensor
    keep: torch.Tensor
    q_pos: torch.Tensor | None
    k_pos: torch.Tensor | None


def packed_layout(
    table: torch.Tensor,
    lengths: torch.Tensor,
    takes: torch.Tensor,
    starts: torch.Tensor,
    *,
    n_q: int,
    n_pairs: int,
    distinct: int,
    num_blocks: int,
    block_size: int,
    windowed: bool,
    slid: torch.Tensor | None = None,
) -> Packed:
    """`table` ([rows, width]): each row's blocks (entries past its length are ignored);
    `lengths`, `takes`, `starts` ([rows]): tokens stored after the step, computed by it, and
    stored before it; `slid` ([rows], None: none): each row's leading entries given back out
    of every layer's window (they read block 0 and are ignored too). `n_q` is the sum of
    `takes`, `n_pairs` the sum over rows of takes x blocks read (ceil(length / block_size)
    less `slid`), `distinct` the number of distinct blocks the rows' keys lie in."""
    device, bs = table.device, block_size
    rows, width = table.shape
    row_ids = torch.arange(rows, device=device)
    q_row = row_ids.repeat_interleave(takes, output_size=n_q)
    q_first = torch.cumsum(takes, 0) - takes
    q_at = torch.arange(n_q, device=device) - q_first[q_row] + starts[q_row]
    index = torch.arange(width, device=device)
    held = (lengths + bs - 1) // bs  # blocks each row's keys lie in
    used = index[None, :] < held[:, None]
    read_from = held
    if slid is not None:
        used &= index[None, :] >= slid[:, None]
        read_from = held - slid
    entry = torch.where(used, table, 0)
    # The step's distinct blocks in ascending order; block 0 (padding) is never handed out.
    present = torch.zeros(num_blocks, dtype=torch.bool, device=device)
    present[entry] = True
    present[0] = False
    blocks = torch.nonzero_static(present, size=distinct).reshape(-1)
    rank = torch.zeros(num_blocks, dtype=torch.long, device=device)
    rank[blocks] = torch.arange(distinct, device=device)
    column = torch.where(used, rank[entry], distinct)  # [rows, width]; distinct: unused
    offsets = torch.arange(bs, device=device)

    # One entry per (query, block of its row): how many leading slots of the block the query
    # sees (its position and before), written into the mask as one row of `bs` flags.
    pairs, q_blocks = n_pairs, read_from[q_row]
    e_query = torch.arange(n_q, device=device).repeat_interleave(q_blocks, output_size=pairs)
    e_first = torch.cumsum(q_blocks, 0) - q_blocks
    e_index = torch.arange(pairs, device=device) - e_first[e_query]
    if slid is not None:
        e_index += slid[q_row][e_query]
    e_row = q_row[e_query]
    seen = (q_at[e_query] + 1 - e_index * bs).clamp_(0, bs)
    visible = offsets[None, :] < torch.arange(bs + 1, device=device)[:, None]  # [bs+1, bs]
    allowed = torch.zeros((n_q, distinct, bs), dtype=torch.bool, device=device)
    allowed[e_query, column[e_row, e_index]] = visible[seen]
    allowed = allowed.reshape(1, 1, n_q, distinct * bs)

    # Slots no row has reached hold no key yet: they read the zeroed block 0.
    filled = torch.zeros(distinct + 1, dtype=torch.long, device=device)
    reach = (lengths[:, None] - index[None, :] * bs).clamp_(0, bs)
    filled.scatter_reduce_(0, column.reshape(-1), reach.reshape(-1), "amax")
    slots = blocks[:, None] * bs + offsets
    read = torch.where(offsets < filled[:distinct, None], slots, 0).reshape(1, -1)
    write = (table[q_row, q_at // bs] * bs + q_at % bs)[None]
    keep = torch.cumsum(takes, 0) - 1
    q_pos = k_pos = None
    if windowed:
        # A block shared by several rows sits at the same index in each (blocks are shared
        # from the first block on), so its slots' positions are the same for all of them.
        first = torch.zeros(distinct + 1, dtype=torch.long, device=device)
        first.scatter_(0, column.reshape(-1), index.expand(rows, -1).reshape(-1))
        q_pos = q_at[None, None, :, None]
        k_pos = (first[:distinct, None] * bs + offsets).reshape(1, 1, 1, -1)
    return Packed(read, write, q_at[None], allowed, keep, q_pos, k_pos)


@dataclass
class Padded:
    """A decoding step as a `[rows, 1]` batch, each row attending to its own keys padded to
    the longest: `read` ([rows, keys]) their slots (0 past a row's length), `write` and
    `positions` ([rows, 1]) the new token's slot and position, `allowed` ([rows, 1, 1, keys]),
    `q_pos`/`k_pos` positions for sliding windows (None without)."""

    read: torch.Tensor
    write: torch.Tensor
    positions: torch.Tensor
    allowed: torch.Tensor
    q_pos: torch.Tensor | None
    k_pos: torch.Tensor | None


def padded_layout(
    table: torch.Tensor, lengths: torch.Tensor, *, block_size: int, windowed: bool
) -> Padded:
    """`table` ([rows, width]): each row's blocks (entries past its length are ignored);
    `lengths` ([rows]): tokens stored after the step, the new one included. Shapes depend on
    `table`'s only, so that a captured step (graphs.py) replays with new values."""
    return PaddedSteps(table, block_size=block_size, windowed=windowed).at(lengths, table.shape[1])


class PaddedSteps:
    """The padded layouts of consecutive decoding steps of the same rows over one block table
    (a decoding run, runs.py): each row's slots are worked out once; a step's layout then
    adds each row's one new key to the last step's (a few ops on `[rows]` tensors, not
    `[rows, keys]` ones), except when the widest row enters a new block."""

    def __init__(self, table: torch.Tensor, *, block_size: int, windowed: bool) -> None:
        """`table` ([rows, width]): each row's blocks, as wide as the widest step needs."""
        bs = block_size
        rows, width = table.shape
        self._block_size = bs
        self._windowed = windowed
        self._k = torch.arange(width * bs, device=table.device)
        # Each block's slots by broadcasting, not by indexing the table per key (several
        # times slower on CPU).
        self._slots = (table[:, :, None] * bs + self._k[:bs]).reshape(rows, width * bs)
        self._keys = 0  # the width in keys of the last layout
        self._read = self._inside = self._k  # (the last layout's, once there is one)

    def at(self, lengths: torch.Tensor, width: int) -> Padded:
        """The layout of the step after which the rows hold `lengths` tokens ([rows], the new
        one included), over the first `width` blocks of each row. Called once a step, in
        order (each row one token longer than at the last call); the layout it returns is
        good until the next call."""
        keys = width * self._block_size
        positions = (lengths - 1)[:, None]
        write = self._slots.gather(1, positions)
        if keys != self._keys:  # the first step, or the widest row entered a new block
            self._keys = keys
            self._inside = self._k[None, :keys] < lengths[:, None]
            self._read = torch.where(self._inside, self._slots[:, :keys], 0)
        else:
            self._inside.scatter_(1, positions, True)
            self._read.scatter_(1, positions, write)
        q_pos = k_pos = None
        if self._windowed:
            q_pos, k_pos = positions[:, None, :, None], self._k[None, None, None, :keys]
        return Padded(self._read, write, positions, self._inside[:, None, None, :], q_pos, k_pos)
