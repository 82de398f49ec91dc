"""Chat messages to prompt token ids."""

from __future__ import annotations

from typing import Any


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of `messages` under the tokenizer's chat template, ready for the reply.

    Content given as a list of parts keeps its text parts only, joined into one string, so that
    templates written for plain-string content work too.
    """
    rendered = [{**message, "content": _text(message.get("content"))} for message in messages]
    ids = tokenizer.apply_chat_template(
        rendered, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return [int(token) for token in ids]


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
