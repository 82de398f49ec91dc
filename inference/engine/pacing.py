"""How much batch work a step carries while interactive requests are in flight.

An interactive request's first token waits for the step under way and then for the step that
prefills its prompt; each later token waits a step. So while interactive requests are in flight
(and for `LINGER_SECONDS` after the last one, since such traffic comes in runs), the engine
keeps its steps near a target time (`BOARDWALK_INTERACTIVE_STEP_MS`, 75 by default: about 13
tokens a second for each stream) by holding back batch work: the batch decoding rows past a
cap wait (they keep their blocks and tokens), and batch prompt pieces are cut to a token cap.
Both caps follow the steps' measured times: a step over the target shrinks them in proportion,
one under it lets them grow back a little. A step that prefills an interactive prompt carries
a quarter of the row cap and no batch prompt.

The caps never go below as many batch rows as there are interactive ones (and an eighth of the
rows) and four blocks of prompt tokens, so batch keeps about half the rows however slow a step
is; where rows cost next to nothing (a small model on a GPU) the steps stay under the target
and batch keeps every row. Without interactive requests none of this is consulted: batch runs
at full speed. Measured: docs/PERFORMANCE.md, "Interactive traffic beside batch".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# After the last interactive request leaves, steps stay paced this long.
LINGER_SECONDS = 1.0
# The row cap in a step that prefills an interactive prompt, as a share of the cap.
PREFILL_SHARE = 0.25
# The least batch prompt tokens a paced step may carry, in blocks: on a CPU a prompt piece's
# forward costs about as much at 16 tokens as at 64, so smaller pieces only slow batch down.
MIN_PROMPT_BLOCKS = 4


@dataclass(frozen=True)
class BatchAllowance:
    """What batch work may join this step: decoding rows and prompt tokens (None: no limit)."""

    rows: int | None
    tokens: int | None

    @property
    def limited(self) -> bool:
        return self.rows is not None or self.tokens is not None


UNLIMITED = BatchAllowance(None, None)


class BatchPacer:
    """The caps on batch work beside interactive requests; one per engine, kept across its
    `generate` calls so that what a step costs is learned once."""

    def __init__(
        self, target_seconds: float, *, max_rows: int, max_tokens: int, block_size: int
    ) -> None:
        self.target_seconds = target_seconds
        self.min_rows = max(1, max_rows // 8)
        self.max_rows = max_rows
        self.min_tokens = min(max_tokens, MIN_PROMPT_BLOCKS * block_size)
        self.max_tokens = max_tokens
        self.row_cap = float(max_rows)
        self.token_cap = float(max_tokens)
        self._block = block_size
        self._interactive_at = -math.inf

    def allowance(self, *, interactive: int, prefill: bool, now: float) -> BatchAllowance:
        """The caps for the next step. `interactive`: the interactive rows in flight;
        `prefill`: the step prefills one's prompt."""
        if self.target_seconds <= 0:
            return UNLIMITED
        if interactive:
            self._interactive_at = now
        elif now - self._interactive_at > LINGER_SECONDS:
            return UNLIMITED
        rows = max(self.min_rows, interactive, int(self.row_cap))
        if prefill:
            return BatchAllowance(max(1, int(rows * PREFILL_SHARE)), 0)
        return BatchAllowance(rows, max(self.min_tokens, int(self.token_cap)))

    def observe(self, seconds: float, *, batch_rows: int, batch_tokens: int) -> None:
        """A paced step that was not an interactive prefill took `seconds`, carrying these
        batch rows and prompt tokens."""
        if seconds > self.target_seconds:
            scale = self.target_seconds / seconds
            if batch_rows:
                self.row_cap = max(float(self.min_rows), min(self.row_cap, batch_rows) * scale)
            if batch_tokens:
                self.token_cap = max(
                    float(self.min_tokens), min(self.token_cap, batch_tokens) * scale
                )
        else:
            self.row_cap = min(float(self.max_rows), self.row_cap + 1)
            self.token_cap = min(float(self.max_tokens), self.token_cap + self._block)
