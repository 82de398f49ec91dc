"""Hermes tool calls (Hermes 2 Pro and 3, Qwen2.5, Qwen3, QwQ): a JSON object per call,
each in its own block, blocks separated by a newline.

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The grammar writes each call's JSON compactly (`{"name":"f","arguments":{…}}`), with the
function's name as a literal and its `parameters` as a schema of their own (a `$ref` in them
resolves against them). Reading accepts any JSON layout the model writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from inference.structured import function_schema, json_rule

from .base import Marks, ToolSyntax

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
# A call's JSON as the grammar writes it.
_HEAD, _ARGUMENTS = '{"name":', ',"arguments":'
_MALFORMED = object()


class Hermes(ToolSyntax):
    name = "hermes"
    trigger = OPEN

    def calls_rules(
        self, tools: list[dict[str, Any]], *, parallel: bool, marks: Marks
    ) -> list[str]:
        lines = [
            'calls: call ("\\n" call)*' if parallel else "calls: call",
            f'call: {marks(OPEN)} "\\n" call_body "\\n" {marks(CLOSE)}',
            "call_body: " + " | ".join(f"call_{i}" for i in range(len(tools))),
        ]
        for i, tool in enumerate(tools):
            head = _HEAD + json.dumps(tool["function"]["name"]) + _ARGUMENTS
            lines.append(f'call_{i}: {json.dumps(head)} arguments_{i} "}}"')
            lines.append(f"arguments_{i}: {json_rule(function_schema(tool))}")
        return lines

    def read_calls(self, text: str, names: Sequence[str]) -> list[tuple[str, str]] | None:
        calls: list[tuple[str, str]] = []
        position = 0
        for match in _BLOCK.finditer(text):
            if text[position : match.start()].strip():
                return None
            position = match.end()
            call = read_call_json(match.group(1))
            if call is None:
                return None
            calls.append(call)
        tail = text[position:].lstrip()  # a cut string argument keeps its trailing blanks
        if tail:
            cut = _read_cut(tail, names)
            if cut is _MALFORMED:
                return None
            if isinstance(cut, tuple):
                calls.append(cut)
        return calls


def read_call_json(body: str) -> tuple[str, str] | None:
    """(name, arguments) of one complete call written as `{"name": …, "arguments": …}`
    (`parameters` also read, as Llama 3.x writes it); None when it is not one."""
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        return call["name"], arguments
    return call["name"], json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def read_cut_json(
    body: str, names: Sequence[str], *, arguments_key: str = _ARGUMENTS
) -> tuple[str, str] | object | None:
    """(name, arguments so far) of a call's compact JSON cut by `max_tokens`; None when its
    name is not known yet; _MALFORMED when `body` does not begin a call."""
    whole = read_call_json(body)
    if whole is not None:
        return whole
    head = _HEAD + '"'
    if len(body) <= len(head):
        return cut_name("", names) if head.startswith(body) else _MALFORMED
    if not body.startswith(head):
        return _MALFORMED
    written, quote, after = body[len(head) :].partition('"')
    if not quote:
        return cut_name(written, names)
    if len(after) <= len(arguments_key):
        return (written, "") if arguments_key.startswith(after) else _MALFORMED
    if not after.startswith(arguments_key):
        return _MALFORMED
    return written, after[len(arguments_key) :]


def cut_name(written: str, names: Sequence[str]) -> tuple[str, str] | None:
    """(the only name of `names` that begins with `written`, no arguments), or None."""
    matching = [name for name in names if name.startswith(written)]
    return (matching[0], "") if len(matching) == 1 else None


def is_malformed(value: object) -> bool:
    return value is _MALFORMED


def _read_cut(tail: str, names: Sequence[str]) -> tuple[str, str] | object | None:
    if len(tail) <= len(OPEN):
        return cut_name("", names) if OPEN.startswith(tail) else _MALFORMED  # in the tag
    if not tail.startswith(OPEN):
        return _MALFORMED
    body = tail[len(OPEN) :].lstrip("\n")
    # Compact JSON holds no raw newline: one ends the call's JSON, and begins its closing tag.
    body, newline, closing = body.partition("\n")
    if newline:
        whole = read_call_json(body)
        return whole if whole is not None and CLOSE.startswith(closing) else _MALFORMED
    return read_cut_json(body, names)
