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
    admission = slot_take(org_id=org_id, now=now)
    admission_tokens_take(admission, tokens=tokens, now=now)
    return admission


def _limits(now: float | None) -> tuple[int, int, float, int, int]:
    """The limits, the time, this minute's window and the seconds until it resets."""
    now = time.time() if now is None else now
    window = int(now // WINDOW_SECONDS)
    reset_tokens = max(1, int((window + 1) * WINDOW_SECONDS - now + 0.999))
    return (
        setting("INTERACTIVE_MAX_CONCURRENT"),
        setting("INTERACTIVE_TOKENS_PER_MINUTE"),
        now,
        window,
        reset_tokens,
    )


def slot_take(*, org_id: str, now: float | None = None) -> Admission:
    """Take a concurrency slot, or raise 429: before the request's prompt is counted, so an
    organization's parallel requests cost the web tier at most its limit's worth of work."""
    ch = channels()
    max_requests, max_tokens, now, window, reset_tokens = _limits(now)
    epoch = int(now // _slot_ttl())
    in_flight = _slot_add(org_id, epoch, 1)
    used = ch.add(_tokens_key(org_id, window), 0, ttl=2 * WINDOW_SECONDS)
    if in_flight > max_requests:
        _slot_add(org_id, epoch, -1)
        raise CapacityExceeded(
            f"Too many interactive requests in flight: your organization's limit is "
            f"{max_requests} at once. Retry when one has finished.",
            code=ErrorCode.RATE_LIMIT_EXCEEDED,
            retry_after=1,
            headers=_headers(max_requests, 0, max_tokens, max_tokens - used, reset_tokens, "1s"),
        )
    admission = Admission(org_id, {}, epoch)
    admission.headers = _headers(
        max_requests,
        max(0, max_requests - in_flight),
        max_tokens,
        max(0, max_tokens - used),
        reset_tokens,
        "0s",
    )
    return admission


def admission_tokens_take(admission: Admission, *, tokens: int, now: float | None = None) -> None:
    """Take `tokens` (prompt + max output) of this minute's budget for the request holding
    `admission`, or give its slot back and raise 429."""
    ch = channels()
    max_requests, max_tokens, now, window, reset_tokens = _limits(now)
    remaining_requests = int(admission.headers["x-ratelimit-remaining-requests"])
    used = ch.add(_tokens_key(admission.org_id, window), tokens, ttl=2 * WINDOW_SECONDS)
    if used > max_tokens:
        ch.add(_tokens_key(admission.org_id, window), -tokens, ttl=2 * WINDOW_SECONDS)
        admission.release()
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
                remaining_requests + 1,
                max_tokens,
                max(0, max_tokens - used + tokens),
                reset_tokens,
                "0s",
            ),
        )
    admission.headers = _headers(
        max_requests,
        remaining_requests,
        max_tokens,
        max(0, max_tokens - used),
        reset_tokens,
        "0s",
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
