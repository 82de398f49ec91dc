"""Decoding steps replayed as CUDA graphs, one per (rows, width) bucket.

A padded decoding step (layout.padded_layout) is a function of three tensors only: each row's
new token, its block table and its length. Rounded up to a bucket (rows and table width to
powers of two), their shapes repeat from step to step, so the whole step (its index tensors,
every layer, the logits) is captured once per bucket and then replayed with one launch: the
host's work per step no longer grows with the model's layers, and no kernel waits for Python.

Padding rows decode token 0 at length 1 with an all-zero table: they write slot 0 of block 0,
which no real row reads unmasked (a masked key only has to hold finite numbers, and these do).

Only on CUDA, where the engine's `cuda_graphs` option is not off, and never across
tensor-parallel ranks; a bucket whose capture fails is
run eagerly from then on, and so is every step a bucket does not cover (a step longer than the
largest width, media rows, prompt pieces).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from boardwalk.logs import exception_trace

logger = logging.getLogger(__name__)


# (token ids [rows, 1], tables [rows, width], lengths [rows]) -> last-position logits [rows, V]
DecodeStep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def graphs_wanted(device: torch.device, setting: bool | None = None) -> bool:
    """Whether decoding steps are captured: `setting` (the engine's `cuda_graphs` option,
    BOARDWALK_ENGINE_CUDA_GRAPHS in project/settings.py; None: on); never off CUDA, nor in a
    process that is one of several ranks."""
    if device.type != "cuda":
        return False
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False  # tensor-parallel ranks: their collectives stay uncaptured
    return setting is not False


def bucket(n: int) -> int:
    """The smallest power of two holding `n`."""
    return 1 << max(0, n - 1).bit_length()


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor
    table: torch.Tensor
    lengths: torch.Tensor
    logits: torch.Tensor


class DecodeGraphs:
    def __init__(
        self, step: DecodeStep, device: torch.device, *, max_rows: int, max_width: int
    ) -> None:
        """`step` runs one padded decoding step eagerly; `max_rows` and `max_width` (table
        entries) bound the buckets captured."""
        self._step = step
        self._device = device
        self._max_rows = bucket(max_rows)
        self._max_width = bucket(max_width)
        self._captured: dict[tuple[int, int], _Captured | None] = {}
        self._pool: Any = None  # one memory pool shared by every bucket's graph

    def run(self, ids: torch.Tensor, table: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The step's logits ([rows, vocab], a copy the caller may change), replayed from its
        bucket's graph, or run eagerly where no graph covers it."""
        rows, width = table.shape
        key = (bucket(rows), bucket(width))
        if key[0] > self._max_rows or key[1] > self._max_width:
            return self._step(ids, table, lengths)
        if key not in self._captured:
            self._captured[key] = self._capture(*key)
        captured = self._captured[key]
        if captured is None:
            return self._step(ids, table, lengths)
        captured.ids[:rows] = ids
        captured.ids[rows:] = 0
        captured.table[:rows, :width] = table
        captured.table[:rows, width:] = 0
        captured.table[rows:] = 0
        captured.lengths[:rows] = lengths
        captured.lengths[rows:] = 1
        captured.graph.replay()
        return captured.logits[:rows].clone()

    def _capture(self, rows: int, width: int) -> _Captured | None:
        device = self._device
        ids = torch.zeros((rows, 1), dtype=torch.long, device=device)
        table = torch.zeros((rows, width), dtype=torch.long, device=device)
        lengths = torch.ones(rows, dtype=torch.long, device=device)
        try:
            # Warm up on a side stream (lazy initialisations must not be captured), then
            # capture; both write only slot 0 of block 0 (every row padding).
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._step(ids, table, lengths)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self._pool):
                logits = self._step(ids, table, lengths)
        except Exception as exc:
            logger.warning(
                # Its message too: a capture runs on placeholder ids, never a request's.
                "decoding steps of %d rows x %d blocks run without a CUDA graph (%s): %s",
                rows,
                width,
                exc,
                exception_trace(exc),
            )
            return None
        return _Captured(graph, ids, table, lengths, logits)
