"""When to try a row again after a retryable upstream answer, and when to stop trying.

Exponential backoff with equal jitter: the n-th failure waits between half and all of
`base * 2^(n-1)` seconds, capped at `cap` (2 s to 30 s by default, as llm-d's batch gateway).
A `Retry-After` from the upstream is a floor: the row waits at least that long. Nothing waits
past the row's deadline: a retry that would start at or after it is not made, and a row whose
deadline has passed is never sent (`may_send`). Deadlines and `now` are seconds since the
epoch; the caller passes its clock, so tests choose time instead of waiting for it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff", "may_send"]


def may_send(now: float, deadline: float | None) -> bool:
    """Whether a row may be sent now: never at or past its deadline."""
    return deadline is None or now < deadline


@dataclass(frozen=True)
class Backoff:
    base_seconds: float = 2.0
    cap_seconds: float = 30.0
    # A Retry-After past this is read as this: an upstream asking for an hour is down, and the
    # row's attempts and deadline decide what happens to it, not one header.
    max_retry_after_seconds: float = 300.0

    def __post_init__(self) -> None:
        if not 0 < self.base_seconds <= self.cap_seconds:
            raise ValueError("backoff needs 0 < base_seconds <= cap_seconds")

    def delay(
        self, failures: int, *, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float:
        """Seconds to wait after the `failures`-th failure in a row (1 for the first)."""
        if failures < 1:
            raise ValueError("failures counts from 1")
        ceiling = min(self.cap_seconds, self.base_seconds * 2 ** min(failures - 1, 32))
        draw = (rng or random).random()
        jittered = ceiling / 2 + draw * ceiling / 2
        if retry_after is not None and retry_after > 0:
            return max(jittered, min(retry_after, self.max_retry_after_seconds))
        return jittered

    def retry_at(
        self,
        now: float,
        failures: int,
        *,
        deadline: float | None,
        retry_after: float | None = None,
        rng: random.Random | None = None,
    ) -> float | None:
        """When to send again, or None when that would be at or past `deadline` (the row is
        then not retried: it ends as its deadline says, never sent late)."""
        at = now + self.delay(failures, retry_after=retry_after, rng=rng)
        return at if may_send(at, deadline) else None
