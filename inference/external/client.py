"""Send one row to an external engine and say what became of it.

`UpstreamClient.send(body, deadline=…)` posts the row's body, with `model` replaced by the
engine's model id, to `{url}/chat/completions` and classifies the answer:

- `Success`: a 2xx JSON object with `choices`; its body is the upstream's answer.
- `Retryable`: 429, 503 and other 5xx, 408, timeouts (a whole-request bound, so a stalled or
  trickling answer counts), connection errors (refused, reset, cut mid-answer) and 2xx bodies
  that are no chat completion. A request the row's deadline cut short is `deadline`: no sign
  of overload, and past its deadline the row is not sent again. `retry_after` carries the
  upstream's `Retry-After` in seconds; `congestion` says whether it is a sign of overload
  (429, 503, 504, 408, timeouts, connection errors), on which the in-flight limit halves
  (`inference.external.limits`).
- `Final`: any other answer (4xx but 408 and 429, 3xx): retrying cannot help. Its `message`
  is the upstream's, which may quote the prompt: it is kept for the row's error and out of
  reprs and logs (`log_text` is what a log line may say).
- `NotSent`: the row's deadline had passed; nothing was sent (`inference.external.backoff`).

One client holds one connection pool (`httpx2`, as the `openai` SDK) and is driven from one
asyncio loop: a worker process runs many `send`s at once, bounded by the pool and by the
in-flight limit it holds a slot of. Cancelling a `send` closes its connection, which vLLM and
SGLang take as an abort of the request.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson

from inference.external.backoff import may_send
from inference.external.upstream import Upstream

__all__ = [
    "Final",
    "NotSent",
    "Outcome",
    "Retryable",
    "Success",
    "UpstreamClient",
    "classify_error",
    "classify_response",
    "retry_after_seconds",
    "upstream_message",
]

# Outcomes that mean the upstream is overloaded or unreachable: the in-flight limit halves.
CONGESTION = frozenset({"rate_limited", "unavailable", "timeout", "connection", "unreachable"})
# The server did not take the row at all: it said it is overloaded (429, 503), or no
# connection could be made. Nothing of the row ran there, so a batch row's retry of it is not
# one of its attempts (inference/external/engine.py).
NOT_TAKEN = frozenset({"rate_limited", "unavailable", "unreachable"})
_MAX_MESSAGE = 1000


@dataclass(frozen=True)
class Success:
    body: dict[str, Any] = field(repr=False)
    status: int = 200


@dataclass(frozen=True)
class Retryable:
    """`reason`: rate_limited, unavailable, server_error, timeout, connection (cut after it
    was made), unreachable (no connection made), invalid_response or deadline."""

    reason: str
    status: int | None = None
    retry_after: float | None = None

    @property
    def congestion(self) -> bool:
        return self.reason in CONGESTION

    @property
    def not_taken(self) -> bool:
        """Whether the server took nothing of the row (module doc: NOT_TAKEN)."""
        return self.reason in NOT_TAKEN


@dataclass(frozen=True)
class Final:
    status: int
    code: str | None = None
    message: str = field(default="", repr=False)

    def log_text(self) -> str:
        """What a log line may say: the status and the upstream's error code, no message."""
        return f"upstream answered {self.status}" + (f" ({self.code})" if self.code else "")


@dataclass(frozen=True)
class NotSent:
    reason: str = "deadline"


Outcome = Success | Retryable | Final | NotSent


def retry_after_seconds(value: str | None, *, now: float | None = None) -> float | None:
    """`Retry-After` as seconds from now: delta-seconds or an HTTP date; None when absent or
    unreadable; never negative."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def upstream_message(content: bytes) -> tuple[str | None, str]:
    """(code, message) of an upstream error body: OpenAI's `{"error": {...}}`, FastAPI's
    `{"detail": ...}`, or the text itself (cut to 1000 characters)."""
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None, content[:_MAX_MESSAGE].decode("utf-8", "replace")
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            code = error.get("code") or error.get("type")
            return (str(code) if code is not None else None), str(error.get("message", ""))[
                :_MAX_MESSAGE
            ]
        if isinstance(error, str):
            return None, error[:_MAX_MESSAGE]
        if "detail" in data:
            return None, str(data["detail"])[:_MAX_MESSAGE]
        if "message" in data:
            return None, str(data["message"])[:_MAX_MESSAGE]
    return None, content[:_MAX_MESSAGE].decode("utf-8", "replace")


def classify_response(
    status: int, headers: Any, content: bytes, *, now: float | None = None
) -> Success | Retryable | Final:
    """The outcome of an answered request (`headers`: a mapping with `.get`)."""
    if 200 <= status < 300:
        try:
            body = orjson.loads(content)
        except orjson.JSONDecodeError:
            return Retryable("invalid_response", status)
        if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
            return Retryable("invalid_response", status)
        return Success(body, status)
    retry_after = retry_after_seconds(headers.get("retry-after"), now=now)
    if status == 429:
        return Retryable("rate_limited", status, retry_after)
    if status == 503:
        return Retryable("unavailable", status, retry_after)
    if status in (408, 504):
        return Retryable("timeout", status, retry_after)
    if status >= 500:
        return Retryable("server_error", status, retry_after)
    code, message = upstream_message(content)
    return Final(status, code, message)


def classify_error(exc: BaseException) -> Retryable:
    """The outcome of a request that got no whole answer."""
    if isinstance(exc, (TimeoutError, httpx2.TimeoutException)):
        return Retryable("timeout")
    if isinstance(exc, httpx2.DecodingError):  # a body its encoding does not decode
        return Retryable("invalid_response")
    if isinstance(exc, httpx2.ConnectError):  # refused, or no route: nothing was sent
        return Retryable("unreachable")
    return Retryable("connection")


class UpstreamClient:
    """A connection pool to one upstream; `send` from one asyncio loop, many at once."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        max_connections: int = 256,
        clock: Callable[[], float] = time.time,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.upstream = upstream
        self._clock = clock
        self._http = httpx2.AsyncClient(
            headers=upstream.headers(),
            timeout=httpx2.Timeout(upstream.request_timeout, connect=upstream.connect_timeout),
            limits=httpx2.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=30.0,
            ),
            follow_redirects=False,
            trust_env=False,
            transport=transport,
        )

    @property
    def http(self) -> httpx2.AsyncClient:
        """The connection pool, with the upstream's key and timeouts (a streamed row is one
        more request on it, inference.external.streaming)."""
        return self._http

    def request_body(self, body: dict[str, Any]) -> bytes:
        """The row's body as sent: the engine's model id, one JSON answer (no stream)."""
        sent = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        sent["model"] = self.upstream.model
        return orjson.dumps(sent)

    async def send(self, body: dict[str, Any], *, deadline: float | None = None) -> Outcome:
        """Post one row; never sent when `deadline` (epoch seconds) has passed, and never
        waited on past it or past the upstream's request timeout."""
        now = self._clock()
        if not may_send(now, deadline):
            return NotSent()
        budget = self.upstream.request_timeout
        if deadline is not None:
            budget = min(budget, deadline - now)
        content = self.request_body(body)
        try:
            async with asyncio.timeout(budget):
                response = await self._http.post(
                    f"{self.upstream.url}/chat/completions", content=content
                )
        except (TimeoutError, httpx2.RequestError) as exc:
            outcome = classify_error(exc)
            if outcome.reason == "timeout" and not may_send(self._clock(), deadline):
                # The row's deadline cut it short, not the upstream's request timeout: no
                # sign of overload, and the row is not retried.
                return Retryable("deadline")
            return outcome
        return classify_response(
            response.status_code, response.headers, response.content, now=self._clock()
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> UpstreamClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
