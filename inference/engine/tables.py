"""The block tables of the sequences in flight, kept on the device.

Each sequence holding blocks has a row of one `[rows, width]` tensor on the model's device. The
block manager records every change it makes to a table (a block appended, a shared block
replaced by its copy, a fork's whole table) as it makes it; the changes reach the device in one
write when a step next reads the tables, so a step costs one small write for the blocks that
changed since the last one instead of rebuilding every table from Python lists.

A row freed by a sequence is handed to the next one as it is: entries past a sequence's own
blocks are never read (every read is bounded by the sequence's length).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_FIRST_ROWS = 64
_FIRST_WIDTH = 64


class DeviceTables:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._table = torch.zeros((_FIRST_ROWS, _FIRST_WIDTH), dtype=torch.long, device=device)
        self._row: dict[object, int] = {}
        self._free = list(range(_FIRST_ROWS - 1, -1, -1))
        self._rows: list[int] = []
        self._columns: list[int] = []
        self._blocks: list[int] = []

    @property
    def holders(self) -> int:
        """Sequences with a row (holding at least one block)."""
        return len(self._row)

    def set(self, holder: object, index: int, block: int) -> None:
        """Entry `index` of `holder`'s table is now `block`."""
        row = self._row.get(holder)
        if row is None:
            row = self._row[holder] = self._take_row()
        if index >= self._table.shape[1]:
            self._widen(index + 1)
        self._rows.append(row)
        self._columns.append(index)
        self._blocks.append(block)

    def extend(self, holder: object, blocks: list[int]) -> None:
        """`holder`'s table is now `blocks` (a fork taking its first choice's)."""
        for index, block in enumerate(blocks):
            self.set(holder, index, block)

    def drop(self, holder: object) -> None:
        """`holder` holds no block any more: its row is free."""
        row = self._row.pop(holder, None)
        if row is not None:
            self._free.append(row)

    def gather(self, holders: Sequence[object], width: int) -> torch.Tensor:
        """The first `width` entries of each holder's table, `[len(holders), width]`."""
        self._flush()
        if width > self._table.shape[1]:
            self._widen(width)
        index = _to([self._row[h] for h in holders], self.device)
        return self._table.index_select(0, index)[:, :width]

    def _flush(self) -> None:
        if not self._rows:
            return
        # index_put_ with a repeated index keeps an unspecified one of its values: only the
        # last change of each entry is written.
        last = dict(zip(zip(self._rows, self._columns, strict=True), self._blocks, strict=True))
        rows = _to([r for r, _ in last], self.device)
        columns = _to([c for _, c in last], self.device)
        self._table.index_put_((rows, columns), _to(list(last.values()), self.device))
        self._rows, self._columns, self._blocks = [], [], []

    def _take_row(self) -> int:
        if not self._free:
            rows = self._table.shape[0]
            self._table = torch.cat([self._table, torch.zeros_like(self._table)])
            self._free = list(range(2 * rows - 1, rows - 1, -1))
        return self._free.pop()

    def _widen(self, width: int) -> None:
        rows, old = self._table.shape
        wider = torch.zeros((rows, max(width, 2 * old)), dtype=torch.long, device=self.device)
        wider[:, :old] = self._table
        self._table = wider


def _to(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)
