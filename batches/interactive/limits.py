"""Per-organization interactive limits: requests in flight, and tokens started per minute.

Counters live in the channels (boardwalk.channels: Redis in production, so every web process
counts against the same limit), each with a time to live. Answers carry OpenAI's
`x-ratelimit-*` headers.

A web process that dies holding a slot never gives it back, and an org's busy counter would
never expire. So slots are counted per epoch of `_slot_ttl()` seconds (longer than any request
lives): a request takes its slot in the current epoch's counter and gives it back there, and
the requests in flight are the current epoch's plus the last one's. A slot that was never
given back stops counting two epochs after it was taken, however busy the organization.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from batches.interactive.config import setting
from boardwalk.channels import channels
from boardwalk.codes import ErrorCode
from boardwalk.errors import CapacityExceeded

WINDOW_SECONDS = 60


def _concurrent_key(org_id: str, epoch: int) -> str:
    return f"interactive:concurrent:{org_id}:{epoch}"


def _tokens_key(org_id: str, window: int) -> str:
    return f"interactive:tokens:{org_id}:{window}"


@dataclass
class Admission:
    """A slot taken for one request; `release` gives it back (once)."""

    org_id: str
    headers: dict[str, str]
    epoch: int = 0  # the slot's epoch (see the module's doc)
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            _slot_add(self.org_id, self.epoch, -1)


def _slot_ttl() -> float:
    """Longer than a request lives: its wait for a worker, its run, and a margin."""
    return setting("INTERACTIVE_TIMEOUT_SECONDS") + setting("INTERACTIVE_QUEUE_SECONDS") + 60


def _slot_add(org_id: str, epoch: int, delta: int) -> int:
    """Add `delta` to the epoch's slots; the requests in flight, this epoch's and the last's."""
    ch = channels()
    ttl = 2 * _slot_ttl()  # read while its epoch and the next last
    taken = ch.add(_concurrent_key(org_id, epoch), delta, ttl=ttl)
    return taken + ch.add(_concurrent_key(org_id, epoch - 1), 0, ttl=ttl)


def admit(*, org_id: str, tokens: int, now: float | None = None) -> Admission:
    """Take a concurrency slot and `tokens` of this minute's budget, or raise 429. `now`
    (epoch seconds) is the current time's stand-in in tests."""
    ch = channels()
    max_requests = setting("INTERACTIVE_MAX_CONCURRENT")
    max_tokens = setting("INTERACTIVE_TOKENS_PER_MINUTE")
    now = time.time() if now is None else now
    window = int(now // WINDOW_SECONDS)
    reset_tokens = max(1, int((window + 1) * WINDOW_SECONDS - now + 0.999))
    epoch = int(now // _slot_ttl())
    in_flight = _slot_add(org_id, epoch, 1)
    if in_flight > max_requests:
        _slot_add(org_id, epoch, -1)
        used = ch.add(_tokens_key(org_id, window), 0, ttl=2 * WINDOW_SECONDS)
        raise CapacityExceeded(
            f"Too many interactive requests in flight: your organization's limit is "
            f"{max_requests} at once. Retry when one has finished.",
            code=ErrorCode.RATE_LIMIT_EXCEEDED,
            retry_after=1,
            headers=_headers(max_requests, 0, max_tokens, max_tokens - used, reset_tokens, "1s"),
        )
    used = ch.add(_tokens_key(org_id, window), tokens, ttl=2 * WINDOW_SECONDS)
    if used > max_tokens:
        ch.add(_tokens_key(org_id, window), -tokens, ttl=2 * WINDOW_SECONDS)
        _slot_add(org_id, epoch, -1)
        never = tokens > max_tokens  # this request alone is over the limit: retrying is vain
        raise CapacityExceeded(
            f"This request needs {tokens} tokens (prompt + max output) and your organization "
            f"has {max(0, max_tokens - used + tokens)} of its {max_tokens} per minute left"
            + ("; lower max_completion_tokens." if never else ". Retry when the minute resets."),
            code=ErrorCode.RATE_LIMIT_EXCEEDED,
            retryable=not never,
            retry_after=None if never else reset_tokens,
            headers=_headers(
                max_requests,
                max_requests - in_flight + 1,
                max_tokens,
                max(0, max_tokens - used + tokens),
                reset_tokens,
                "0s",
            ),
        )
    return Admission(
        org_id,
        _headers(
            max_requests,
            max(0, max_requests - in_flight),
            max_tokens,
            max(0, max_tokens - used),
            reset_tokens,
            "0s",
        ),
        epoch,
    )


def _headers(
    limit_requests: int,
    remaining_requests: int,
    limit_tokens: int,
    remaining_tokens: int,
    reset_tokens: int,
    reset_requests: str,
) -> dict[str, str]:
    # "requests" counts requests in flight at once (not per minute, as OpenAI's do).
    return {
        "x-ratelimit-limit-requests": str(limit_requests),
        "x-ratelimit-remaining-requests": str(max(0, remaining_requests)),
        "x-ratelimit-reset-requests": reset_requests,
        "x-ratelimit-limit-tokens": str(limit_tokens),
        "x-ratelimit-remaining-tokens": str(max(0, remaining_tokens)),
        "x-ratelimit-reset-tokens": f"{reset_tokens}s",
    }
