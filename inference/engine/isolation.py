"""A step's logits and tokens, with every failure pinned on the request it belongs to.

The model runner (runner.py) runs a step's work as two forwards (decoding rows, then prompt
pieces, so one-token rows are not padded to a prompt piece's length) and takes their logits
(`step_logits`); when a forward raises (out of memory aside: the engine halves the step), each
sequence of it runs alone, and only the requests whose own forward raises fail. Sampling
(`next_tokens`) is the same: a batched `sample` that raises is done again row by row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from boardwalk.logs import exception_trace

from .sampling import sample
from .sequence import Failed, Sequence, Work

logger = logging.getLogger(__name__)


@dataclass
class StepLogits:
    """One step's last-position logits, a row per scheduled sequence in the order of the
    step's work; `ok[i]` is False where that sequence's forward failed (its row is garbage,
    or there is no tensor at all when every forward failed)."""

    values: torch.Tensor | None
    ok: list[bool]


def step_logits(
    work: Work,
    failed: Failed,
    forward: Callable[[Work], torch.Tensor],
    check_ranks: Callable[[], None],
) -> StepLogits:
    """Logits of the last computed position of each scheduled sequence, in the order of
    `work` (a row whose forward failed is marked, its request added to `failed`), from
    `forward` (the runner's). `check_ranks()`: asked after a forward raised, before a
    request is blamed."""
    ok = [True] * len(work)
    values: torch.Tensor | None = None
    singles = [take == 1 for _, take in work]
    for single in (True, False):
        group = [i for i, one in enumerate(singles) if one == single]
        if not group:
            continue
        try:
            out = forward([work[i] for i in group])
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:
            check_ranks()
            if len(group) == 1:
                logger.error("a sequence's forward failed: %s", exception_trace(exc))
                failed.add(work[group[0]][0].owner)
                ok[group[0]] = False
                continue
            # Find the culprit: each sequence alone.
            for i in group:
                try:
                    row = forward([work[i]])
                except torch.OutOfMemoryError:
                    raise
                except Exception as alone:
                    check_ranks()
                    logger.error("a sequence's forward failed: %s", exception_trace(alone))
                    failed.add(work[i][0].owner)
                    ok[i] = False
                    continue
                values = _place(values, row, [i], len(work))
            continue
        # The whole step in one forward (the usual case) needs no copy.
        values = out if len(group) == len(work) else _place(values, out, group, len(work))
    return StepLogits(values, ok)


def next_tokens(
    logits: torch.Tensor, sequences: list[Sequence], failed: Failed
) -> list[int | None]:
    """The token each sequence samples from its row of `logits`; None for a sequence whose
    sampling raised (its request is added to `failed`)."""
    samplings = [s.sampling for s in sequences]
    histories = [s.tokens for s in sequences]
    try:
        return list(sample(logits, samplings, histories))
    except Exception as exc:
        logger.warning("batched sampling failed, sampling row by row: %s", exception_trace(exc))
    tokens: list[int | None] = []
    for i, seq in enumerate(sequences):  # find the row that raised
        try:
            tokens.append(sample(logits[i : i + 1], samplings[i : i + 1], histories[i : i + 1])[0])
        except Exception as exc:
            logger.error("sampling failed for a sequence: %s", exception_trace(exc))
            failed.add(seq.owner)
            tokens.append(None)
    return tokens


def _place(values: torch.Tensor | None, rows: torch.Tensor, at: list[int], n: int) -> torch.Tensor:
    """`values` (made `[n, vocab]` when None) with `rows` written at the indexes `at`."""
    if values is None:
        values = torch.zeros((n, rows.shape[-1]), dtype=rows.dtype, device=rows.device)
    values[_to(at, rows.device)] = rows
    return values


def _to(values: list[Any], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)
