"""Relay one streamed answer of an external engine (an interactive request with `stream`).

`send_streaming(client, body, deadline=…, on_delta=…)` posts the row's body with `stream: true`
and `stream_options: {include_usage: true}` (model replaced, as `UpstreamClient.send` does)
and reads the server's server-sent events as they come: each chunk's new text and reasoning
go to `on_delta` at once (the worker turns them into `RelayedPartial`s, which the interactive
feed relays to the client under Boardwalk's id and model), and the chunks are put together
(`Assembly`) into the `chat.completion` body a non-streamed answer would have been: each
choice's content, reasoning, tool calls (their argument pieces joined), logprobs and finish
reason, and the usage of the last chunk that carried one (vLLM and SGLang send it on a last
chunk with no choices when asked; `transformers serve` always sends it with the finish).

The outcome is classified as `UpstreamClient.send`'s: a status other than 200 is read whole
and classified (`classify_response`), a server that answered one JSON body instead of a
stream is taken as it is, and a stream that ends before every choice finished (no finish
reason and no `[DONE]`), breaks off, or carries an `{"error": …}` event is `Retryable`. The
caller must not retry a stream that already sent text (`Streamed.started`): the client has
it. Cancelling the call closes the connection, which the server takes as an abort.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson

from inference.engine.types import PartialResult
from inference.external.backoff import may_send
from inference.external.client import (
    NotSent,
    Outcome,
    Retryable,
    Success,
    UpstreamClient,
    classify_error,
    classify_response,
)

__all__ = ["Assembly", "RelayedPartial", "Streamed", "send_streaming", "streaming_body"]

_DONE = "[DONE]"


@dataclass
class RelayedPartial(PartialResult):
    """A streamed piece of an external engine's answer: the server already parted the answer
    (`text`) from the reasoning (`reasoning`), so neither is read in the revision's dialect
    again (Boardwalk's own engine yields plain `PartialResult`s of raw text)."""

    reasoning: str = ""


@dataclass
class _Choice:
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: list[Any] | None = None
    finish_reason: str | None = None


class Assembly:
    """The chunks of one streamed answer put together, as they come."""

    def __init__(self) -> None:
        self.choices: dict[int, _Choice] = {}
        self.usage: dict[str, Any] | None = None
        self.head: dict[str, Any] = {}
        self.done = False  # the server sent `[DONE]`

    def add(self, chunk: dict[str, Any]) -> list[tuple[int, str, str]]:
        """Take one chunk; returns its new (choice index, text, reasoning) pieces."""
        if not self.head:
            self.head = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        pieces = []
        entries = chunk.get("choices")
        for position, entry in enumerate(entries if isinstance(entries, list) else []):
            if not isinstance(entry, dict):
                continue
            index = entry.get("index")
            index = index if isinstance(index, int) else position
            choice = self.choices.setdefault(index, _Choice())
            delta = entry.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            text = _text(delta.get("content"))
            reasoning = _text(delta.get("reasoning_content")) or _text(delta.get("reasoning"))
            choice.content.append(text)
            choice.reasoning.append(reasoning)
            for call in delta.get("tool_calls") or []:
                if isinstance(call, dict):
                    _merge_call(choice.calls, call)
            logprobs = entry.get("logprobs")
            if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
                choice.logprobs = (choice.logprobs or []) + logprobs["content"]
            if entry.get("finish_reason"):
                choice.finish_reason = str(entry["finish_reason"])
            if text or reasoning:
                pieces.append((index, text, reasoning))
        return pieces

    @property
    def started(self) -> bool:
        """Whether any text or reasoning came (and went on to the client)."""
        return any(any(c.content) or any(c.reasoning) for c in self.choices.values())

    @property
    def complete(self) -> bool:
        """Whether the answer ended as the server meant it to: `[DONE]`, or every choice
        finished (`transformers serve` sends no `[DONE]`)."""
        if self.done:
            return True
        return bool(self.choices) and all(c.finish_reason for c in self.choices.values())

    def streamed_text(self) -> str:
        """Everything generated so far, for counting when the stream is cut short."""
        return "".join(
            "".join(c.reasoning) + "".join(c.content) + _calls_text(c.calls)
            for c in self.choices.values()
        )

    def body(self) -> dict[str, Any]:
        """The `chat.completion` body the chunks make up (no `usage` when none came)."""
        choices = []
        for index in sorted(self.choices):
            choice = self.choices[index]
            message: dict[str, Any] = {"role": "assistant", "content": "".join(choice.content)}
            reasoning = "".join(choice.reasoning)
            if reasoning:
                message["reasoning_content"] = reasoning
            if choice.calls:
                message["tool_calls"] = [choice.calls[i] for i in sorted(choice.calls)]
                message["content"] = message["content"] or None
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "finish_reason": choice.finish_reason or "stop",
                    "logprobs": {"content": choice.logprobs} if choice.logprobs else None,
                }
            )
        body: dict[str, Any] = {**self.head, "object": "chat.completion", "choices": choices}
        if self.usage is not None:
            body["usage"] = self.usage
        return body


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _merge_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    """One tool-call delta into the choice's calls: its id, type and name when given, its
    arguments appended (servers stream them in pieces)."""
    index = delta.get("index")
    index = index if isinstance(index, int) else len(calls)
    call = calls.setdefault(
        index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if isinstance(delta.get("id"), str) and delta["id"]:
        call["id"] = delta["id"]
    function = delta.get("function")
    if isinstance(function, dict):
        if isinstance(function.get("name"), str) and function["name"]:
            call["function"]["name"] = function["name"]
        call["function"]["arguments"] += _text(function.get("arguments"))


def _calls_text(calls: dict[int, dict[str, Any]]) -> str:
    return "".join(c["function"]["name"] + c["function"]["arguments"] for c in calls.values())


def streaming_body(client: UpstreamClient, body: dict[str, Any]) -> bytes:
    """The row's body as sent for a stream: the engine's model id, `stream: true`, and the
    usage asked for on a last chunk."""
    sent = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    sent |= {
        "model": client.upstream.model,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return orjson.dumps(sent)


@dataclass(frozen=True)
class Streamed:
    """What became of a streamed send: its outcome (a `Success`'s body is the assembled
    answer), and whether text already went to the client (then it must not be retried)."""

    outcome: Outcome
    started: bool


async def send_streaming(
    client: UpstreamClient,
    body: dict[str, Any],
    *,
    deadline: float | None,
    on_delta: Callable[[int, str, str], None],
    assembly: Assembly | None = None,
) -> Streamed:
    """Post one row as a stream, handing each piece of text to `on_delta(index, text,
    reasoning)` as it comes; never sent past `deadline`, never waited on past it or the
    upstream's request timeout. `assembly`: where the chunks are put together (the caller's,
    to count what came when it cancels the call)."""
    assembly = assembly if assembly is not None else Assembly()
    now = time.time()
    if not may_send(now, deadline):
        return Streamed(NotSent(), False)
    upstream = client.upstream
    budget = upstream.request_timeout
    if deadline is not None:
        budget = min(budget, deadline - now)
    try:
        async with asyncio.timeout(budget):
            outcome = await _read(client, streaming_body(client, body), assembly, on_delta)
    except (TimeoutError, httpx2.RequestError) as exc:
        outcome = classify_error(exc)
        if outcome.reason == "timeout" and not may_send(time.time(), deadline):
            outcome = Retryable("deadline")
    return Streamed(outcome, assembly.started)


async def _read(
    client: UpstreamClient,
    content: bytes,
    assembly: Assembly,
    on_delta: Callable[[int, str, str], None],
) -> Outcome:
    url = f"{client.upstream.url}/chat/completions"
    headers = {"accept": "text/event-stream"}
    http = client.http
    async with http.stream("POST", url, content=content, headers=headers) as response:
        kind = response.headers.get("content-type", "")
        if response.status_code != 200 or not kind.startswith("text/event-stream"):
            # An error status, or a server that answered one JSON body all the same.
            data = await response.aread()
            return classify_response(response.status_code, response.headers, data)
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue  # comments, event names, the blank lines between events
            payload = line[5:].strip()
            if payload == _DONE:
                assembly.done = True
                break
            try:
                chunk = orjson.loads(payload)
            except orjson.JSONDecodeError:
                return Retryable("invalid_response", response.status_code)
            if not isinstance(chunk, dict) or "error" in chunk:
                # An error event mid-stream (vLLM's, `transformers serve`'s): the answer
                # broke off.
                return Retryable("server_error", response.status_code)
            for index, text, reasoning in assembly.add(chunk):
                on_delta(index, text, reasoning)
    if not assembly.complete:
        return Retryable("connection", 200)  # the stream ended before the answer did
    return Success(assembly.body())
