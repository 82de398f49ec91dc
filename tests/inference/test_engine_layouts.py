"""The packed layout's index tensors and the device copy of the block tables, checked against
what they stand for, written out key by key in Python."""

from __future__ import annotations

import math
import random

import pytest
import torch

from inference.engine.layout import packed_layout, padded_layout
from inference.engine.tables import DeviceTables


def _rows(rng: random.Random, *, rows: int, bs: int, shared: int, decode: bool):
    """Block tables of `rows` sequences whose first `shared` blocks are one prefix, each
    holding a spare block past its length at times, and the step's tokens per row."""
    free = list(range(1, 4000))
    rng.shuffle(free)
    prefix = [free.pop() for _ in range(shared)]
    tables, lengths, takes = [], [], []
    for _ in range(rows):
        length = rng.randint(shared * bs + 1, shared * bs + 70)
        take = 1 if decode else rng.randint(1, min(9, length))
        held = math.ceil(length / bs) + rng.randint(0, 1)
        tables.append(prefix + [free.pop() for _ in range(held - shared)])
        lengths.append(length)
        takes.append(take)
    return tables, lengths, takes


@pytest.mark.parametrize("bs", [4, 16])
@pytest.mark.parametrize("decode", [True, False], ids=["decoding", "prompt-pieces"])
@pytest.mark.parametrize("shared", [0, 3])
@pytest.mark.parametrize("sliding", [False, True], ids=["all-held", "slid"])
def test_packed_layout_lets_each_query_see_its_own_keys_once(
    bs: int, decode: bool, shared: int, sliding: bool
) -> None:
    """`sliding`: each row has given back some leading blocks out of every window (their
    entries read 0, blocks.py `slide`; a shared block may be given back by one row only)."""
    rng = random.Random(bs * 100 + shared * 10 + decode + 1000 * sliding)  # noqa: S311 (test data)
    tables, lengths, takes = _rows(rng, rows=7, bs=bs, shared=shared, decode=decode)
    starts = [n - t for n, t in zip(lengths, takes, strict=True)]
    slid = [rng.randint(0, start // bs) if sliding else 0 for start in starts]
    tables = [[0] * k + t[k:] for t, k in zip(tables, slid, strict=True)]
    width = math.ceil(max(lengths) / bs)
    padded = [t[:width] + [0] * (width - len(t[:width])) for t in tables]
    used = {b for t, n in zip(tables, lengths, strict=True) for b in t[: math.ceil(n / bs)]} - {0}
    packed = packed_layout(
        torch.tensor(padded),
        torch.tensor(lengths),
        torch.tensor(takes),
        torch.tensor(starts),
        n_q=sum(takes),
        n_pairs=sum(
            t * (math.ceil(n / bs) - k) for t, n, k in zip(takes, lengths, slid, strict=True)
        ),
        distinct=len(used),
        num_blocks=4000,
        block_size=bs,
        windowed=True,
        slid=torch.tensor(slid) if sliding else None,
    )

    # Every distinct block once, ascending, a slot of it per column; slots no row reached
    # read block 0.
    blocks = sorted(used)
    reached = {
        t[p // bs] * bs + p % bs
        for t, n, k in zip(tables, lengths, slid, strict=True)
        for p in range(k * bs, n)
    }
    columns = [b * bs + o for b in blocks for o in range(bs)]
    assert packed.read[0].tolist() == [s if s in reached else 0 for s in columns]
    # Query by query: its slot, its position, and exactly its own sequence's keys up to it.
    queries = [(r, starts[r] + i) for r in range(len(tables)) for i in range(takes[r])]
    assert packed.positions[0].tolist() == [p for _, p in queries]
    assert packed.write[0].tolist() == [tables[r][p // bs] * bs + p % bs for r, p in queries]
    for q, (r, p) in enumerate(queries):
        own = {tables[r][k // bs] * bs + k % bs for k in range(slid[r] * bs, p + 1)}
        assert packed.allowed[0, 0, q].tolist() == [s in own for s in columns], (r, p)
    assert packed.keep.tolist() == [sum(takes[: r + 1]) - 1 for r in range(len(tables))]
    # Window positions: a reached slot's position within the sequences that hold it.
    position = {
        t[p // bs] * bs + p % bs: p
        for t, n, k in zip(tables, lengths, slid, strict=True)
        for p in range(k * bs, n)
    }
    assert packed.k_pos is not None and packed.q_pos is not None
    for column, slot in enumerate(columns):
        if slot in reached:
            assert packed.k_pos[0, 0, 0, column].item() == position[slot]


def test_padded_layout_reads_each_rows_keys_padded_with_block_zero() -> None:
    tables, lengths = [[5, 9, 2], [7, 0, 0]], [9, 3]
    pad = padded_layout(torch.tensor(tables), torch.tensor(lengths), block_size=4, windowed=False)
    assert pad.read.tolist() == [
        [20, 21, 22, 23, 36, 37, 38, 39, 8, 0, 0, 0],
        [28, 29, 30, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    ]
    assert pad.write.tolist() == [[8], [30]]
    assert pad.positions.tolist() == [[8], [2]]
    assert pad.allowed[:, 0, 0].tolist() == [[k < 9 for k in range(12)], [k < 3 for k in range(12)]]


def test_device_tables_follow_every_change_in_order() -> None:
    tables = DeviceTables(torch.device("cpu"))
    holders = [object() for _ in range(100)]  # more than the first rows: the tensor grows
    for i, h in enumerate(holders):
        for j in range(3):
            tables.set(h, j, 1000 * i + j)
    tables.set(holders[0], 1, 7)  # copy on write: the later change wins
    tables.set(holders[0], 1, 8)
    tables.set(holders[1], 90, 5)  # past the first width: the tensor widens
    assert tables.gather([holders[1], holders[0]], 3).tolist() == [
        [1000, 1001, 1002],
        [0, 8, 2],
    ]
    assert tables.gather([holders[1]], 91)[0, 90].item() == 5
    tables.drop(holders[0])
    fork = object()
    tables.extend(fork, [4, 5])  # takes the freed row; entries past its own are not read
    assert tables.holders == 100
    assert tables.gather([fork], 2).tolist() == [[4, 5]]
    assert tables.gather([holders[99]], 3).tolist() == [[99000, 99001, 99002]]
