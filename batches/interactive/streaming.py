"""Chat Completions chunks (`stream: true`), as OpenAI's API sends them, from the replies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class Chunks:
    """Builds the chunks of one completion: each choice opens with its role, its reasoning
    (`reasoning_content`) and then its text come as deltas (partials, or the whole of each when
    the engine yielded none), tool calls come whole at the end, and with include_usage a last
    chunk carries usage and no choices."""

    def __init__(
        self,
        *,
        completion_id: str,
        model: str,
        created: int,
        fingerprint: str,
        tier: str,
        include_usage: bool,
        n: int,
        buffer_text: bool,
    ) -> None:
        self.head = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": fingerprint,
            "service_tier": tier,
        }
        self.include_usage = include_usage
        self.n = n
        self.buffer_text = buffer_text  # tool calls: the raw text is not the answer
        self.sent: dict[int, str] = {}  # text sent per choice
        self.thought: dict[int, str] = {}  # reasoning sent per choice

    def _chunk(self, choices: list[dict[str, Any]]) -> bytes:
        payload = {**self.head, "choices": choices}
        if self.include_usage:
            payload["usage"] = None
        return event(payload)

    def opening(self) -> Iterator[bytes]:
        for index in range(self.n):
            self.sent[index] = ""
            yield self._chunk([_delta(index, {"role": "assistant", "content": ""})])

    def partial(self, index: int, text: str, reasoning: str = "") -> Iterator[bytes]:
        if reasoning:
            self.thought[index] = self.thought.get(index, "") + reasoning
            yield self._chunk([_delta(index, {"reasoning_content": reasoning})])
        if self.buffer_text or not text:
            return
        self.sent[index] = self.sent.get(index, "") + text
        yield self._chunk([_delta(index, {"content": text})])

    def closing(self, body: dict[str, Any]) -> Iterator[bytes]:
        for choice in body["choices"]:
            index = choice["index"]
            message = choice["message"]
            reasoning = message.get("reasoning_content") or ""
            thought = self.thought.get(index, "")
            if reasoning.startswith(thought) and len(reasoning) > len(thought):
                yield self._chunk([_delta(index, {"reasoning_content": reasoning[len(thought) :]})])
            content = message.get("content") or ""
            already = self.sent.get(index, "")
            if content.startswith(already) and len(content) > len(already):
                yield self._chunk([_delta(index, {"content": content[len(already) :]})])
            calls = message.get("tool_calls")
            if calls:
                numbered = [{"index": i, **call} for i, call in enumerate(calls)]
                yield self._chunk([_delta(index, {"tool_calls": numbered})])
            last = _delta(index, {}, finish_reason=choice["finish_reason"])
            last["logprobs"] = choice.get("logprobs")
            yield self._chunk([last])
        if self.include_usage:
            yield event({**self.head, "choices": [], "usage": body["usage"]})
        yield DONE


def _delta(index: int, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
