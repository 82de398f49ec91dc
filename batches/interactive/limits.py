"""Per-organization interactive limits: requests in flight, and tokens started per minute.

Counters live in the channels (boardwalk.channels: Redis in production, so every web process
counts against the same limit), each with a time to live, so a process that died holding a
slot frees it by expiry. Answers carry OpenAI's `x-ratelimit-*` headers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from batches.interactive.config import setting
from boardwalk.channels import channels
from boardwalk.codes import ErrorCode
from boardwalk.errors import CapacityExceeded

WINDOW_SECONDS = 60


def _concurrent_key(org_id: str) -> str:
    return f"interactive:concurrent:{org_id}"


def _tokens_key(org_id: str, window: int) -> str:
    return f"interactive:tokens:{org_id}:{window}"


@dataclass
class Admission:
    """A slot taken for one request; `release` gives it back (once)."""

    org_id: str
    headers: dict[str, str]
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            channels().add(_concurrent_key(self.org_id), -1, ttl=_slot_ttl())


def _slot_ttl() -> float:
    return setting("INTERACTIVE_TIMEOUT_SECONDS") + setting("INTERACTIVE_QUEUE_SECONDS") + 60


def admit(*, org_id: str, tokens: int) -> Admission:
    """Take a concurrency slot and `tokens` of this minute's budget, or raise 429."""
    ch = channels()
    max_requests = setting("INTERACTIVE_MAX_CONCURRENT")
    max_tokens = setting("INTERACTIVE_TOKENS_PER_MINUTE")
    now = time.time()
    window = int(now // WINDOW_SECONDS)
    reset_tokens = max(1, int((window + 1) * WINDOW_SECONDS - now + 0.999))
    in_flight = ch.add(_concurrent_key(org_id), 1, ttl=_slot_ttl())
    if in_flight > max_requests:
        ch.add(_concurrent_key(org_id), -1, ttl=_slot_ttl())
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
        ch.add(_concurrent_key(org_id), -1, ttl=_slot_ttl())
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
