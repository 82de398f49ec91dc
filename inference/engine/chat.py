"""Chat messages to prompt token ids."""

from __future__ import annotations

import json
from typing import Any


def render_prompt(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """Token ids of `messages` (and `tools`) under the tokenizer's chat template, ready for the
    reply.

    Content given as a list of parts keeps its text parts only, joined into one string, so that
    templates written for plain-string content work too. The arguments of earlier tool calls
    are handed to the template as objects (the transformers convention), when they parse.
    """
    rendered = [_message(message) for message in messages]
    ids = tokenizer.apply_chat_template(
        rendered, tools=tools or None, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return [int(token) for token in ids]


def _message(message: dict[str, Any]) -> dict[str, Any]:
    rendered = {**message, "content": _text(message.get("content"))}
    if message.get("tool_calls"):
        rendered["tool_calls"] = [
            {**call, "function": {**call["function"], "arguments": _arguments(call)}}
            for call in message["tool_calls"]
        ]
    return rendered


def _arguments(call: dict[str, Any]) -> Any:
    arguments = call["function"].get("arguments")
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return arguments


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(
        part.get("text", "")
        for part in content
        if isinstance(part, dict) and part.get("type") == "text"
    )
