"""Chat messages to prompt token ids."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inference.media_layout import MediaLayout

MEDIA_PART_TYPES = {"image_url": "image", "input_audio": "audio"}
# Put inside a placeholder's text where a message quotes it, so that the text never becomes
# the placeholder token (which the processor would pair with media that is not there).
_WORD_JOINER = "\u2060"


class PlaceholderMismatch(Exception):
    """The rendered prompt holds a different number of placeholders than the row has media."""


@dataclass(frozen=True)
class RenderedPrompt:
    ids: list[int]
    spans: list[tuple[int, int]]  # (start, length) of each media part's placeholders, in order


def render_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    options: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of `messages` (and `tools`) under the tokenizer's chat template, ready for the
    reply. `options`: template variables (`template_options`).

    Content given as a list of parts keeps its text parts only, joined into one string, so that
    templates written for plain-string content work too. The arguments of earlier tool calls
    are handed to the template as objects (the transformers convention), when they parse.
    """
    return _render(tokenizer, [text_message(message) for message in messages], tools, options)


def template_options(tokenizer: Any, body: Mapping[str, Any]) -> dict[str, Any]:
    """The template variables a body sets through the revision's dialect (`reasoning_effort`).
    A revision's tokenizer (the web's ChatTokenizer, a worker's transformers tokenizer)
    carries its dialect as `tokenizer.dialect` (inference/dialects); none: no variables."""
    dialect = getattr(tokenizer, "dialect", None)
    return dialect.template_options(body) if dialect is not None else {}


def template_messages(tokenizer: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the revision's chat template reads them (its dialect's field names)."""
    dialect = getattr(tokenizer, "dialect", None)
    return dialect.template_messages(messages) if dialect is not None else messages


def text_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the chat template sees it on a text-only revision (render_prompt)."""
    return _message(message, None)


def media_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The image and audio parts of `messages`, in prompt order."""
    return [
        part
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") in MEDIA_PART_TYPES
    ]


def render_media_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    layout: MediaLayout,
    counts: Sequence[int],
    options: Mapping[str, Any] | None = None,
) -> RenderedPrompt:
    """Like render_prompt for a revision with media: each media part becomes its placeholder
    token, expanded to `counts[i]` copies (what the encoder yields for part i), and any quoted
    placeholder in the text is broken up. Raises PlaceholderMismatch when the template did not
    keep one placeholder per part (e.g. a template that drops parts, or one quoted in a tool
    call's arguments)."""
    ids = _render(tokenizer, [_message(message, layout) for message in messages], tools, options)
    found = [i for i, token in enumerate(ids) if token == layout.token_id]
    if len(found) != len(counts):
        raise PlaceholderMismatch(f"{len(found)} placeholders for {len(counts)} media parts")
    expanded: list[int] = []
    spans: list[tuple[int, int]] = []
    last = 0
    for at, count in zip(found, counts, strict=True):
        expanded += ids[last:at]
        spans.append((len(expanded), count))
        expanded += [layout.token_id] * count
        last = at + 1
    expanded += ids[last:]
    return RenderedPrompt(expanded, spans)


def _render(
    tokenizer: Any,
    rendered: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    options: Mapping[str, Any] | None,
) -> list[int]:
    ids = tokenizer.apply_chat_template(
        template_messages(tokenizer, rendered),
        tools=tools or None,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        **(options or {}),
    )
    return [int(token) for token in ids]


def _message(message: dict[str, Any], layout: MediaLayout | None) -> dict[str, Any]:
    rendered = {**message, "content": _text(message.get("content"), layout)}
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


def _text(content: Any, layout: MediaLayout | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return _escaped(content, layout)
    pieces = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            pieces.append(_escaped(part.get("text", ""), layout))
        elif layout is not None and MEDIA_PART_TYPES.get(part.get("type", "")) == layout.modality:
            pieces.append(layout.token)
    return "".join(pieces)


def _escaped(text: str, layout: MediaLayout | None) -> str:
    if layout is None or layout.token not in text:
        return text
    return text.replace(layout.token, layout.token[0] + _WORD_JOINER + layout.token[1:])
