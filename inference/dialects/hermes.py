"""Hermes tool calls (Hermes 2 Pro and 3, Qwen2.5, Qwen3, QwQ): a JSON object per call,
each in its own block, blocks separated by a newline, as these families' chat templates render
an earlier turn's calls (after its text, if any):

    Let me look that up.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Text before the calls is the answer's content. `<tool_call>` and `</tool_call>` are single
tokens of the Qwen vocabularies (added tokens, not special ones); they are the syntax's markup,
so that a grammar writes them as those tokens (llguidance takes every added token for a special
one, which plain text can never spell). In vocabularies without them (Hermes 3 read with Llama
3.1's tokenizer) they are text.

The grammar writes each call's JSON compactly (`{"name":"f","arguments":{…}}`), with the
function's name as a literal and its `parameters` as a schema of their own (a `$ref` in them
resolves against them). Reading accepts any JSON layout the model writes, whole or cut by
`max_tokens`, and re-serialises complete arguments compactly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from inference.structured import function_schema, json_rule

from .base import Marks, ToolSyntax, compact

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
# A call's JSON as the grammar writes it.
_HEAD, _ARGUMENTS = '{"name":', ',"arguments":'
# The beginning of a call's JSON in any layout, up to its name; then what follows the name, up
# to its arguments (`parameters` as Llama 3.x writes it).
_NAME_AT = re.compile(r'\{\s*"name"\s*:\s*"')
_ARGUMENTS_AT = re.compile(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_BLANKS = re.compile(r"\s+")
_DECODER = json.JSONDecoder()
_MALFORMED = object()


class Hermes(ToolSyntax):
    name = "hermes"
    trigger = OPEN
    markup = (OPEN, CLOSE)
    text_before_calls = True

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
    return _call_of(call)


def read_cut_json(body: str, names: Sequence[str]) -> tuple[str, str] | object | None:
    """(name, arguments so far) of a call's JSON (in any layout) cut by `max_tokens`; None
    when its name is not known yet; _MALFORMED when `body` does not begin a call. Arguments
    that are whole already come back compact, others as written so far."""
    whole = read_call_json(body)
    if whole is not None:
        return whole
    head = _NAME_AT.match(body)
    if head is None:  # cut before the name's opening quote: the head so far, blanks aside
        written = _BLANKS.sub("", body)
        return cut_name("", names) if '{"name":"'.startswith(written) else _MALFORMED
    written, quote, after = body[head.end() :].partition('"')
    if not quote:
        return cut_name(written, names)
    arguments = _ARGUMENTS_AT.match(after)
    if arguments is None:  # cut before the arguments begin
        so_far = _BLANKS.sub("", after)
        known = any(key.startswith(so_far) for key in (_ARGUMENTS, ',"parameters":'))
        return (written, "") if known else _MALFORMED
    return written, _arguments_so_far(after[arguments.end() :])


def cut_name(written: str, names: Sequence[str]) -> tuple[str, str] | None:
    """(the only name of `names` that begins with `written`, no arguments), or None."""
    matching = [name for name in names if name.startswith(written)]
    return (matching[0], "") if len(matching) == 1 else None


def is_malformed(value: object) -> bool:
    return value is _MALFORMED


def _call_of(call: Any) -> tuple[str, str] | None:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        return call["name"], arguments
    return call["name"], compact(arguments)


def _arguments_so_far(written: str) -> str:
    """A cut call's arguments: compact once they are a whole JSON value (only the call's
    closing brace was cut), else as written."""
    try:
        value, end = _DECODER.raw_decode(written)
    except ValueError:
        return written
    if written[end:].strip():
        return written
    return value if isinstance(value, str) else compact(value)


def _read_cut(tail: str, names: Sequence[str]) -> tuple[str, str] | object | None:
    if len(tail) <= len(OPEN):
        return cut_name("", names) if OPEN.startswith(tail) else _MALFORMED  # in the tag
    if not tail.startswith(OPEN):
        return _MALFORMED
    body = tail[len(OPEN) :].lstrip()
    try:
        call, end = _DECODER.raw_decode(body)
    except ValueError:  # the call's JSON is not whole yet
        return read_cut_json(body, names)
    # The JSON is whole: only blanks and the beginning of the closing tag may follow.
    whole = _call_of(call)
    return whole if whole is not None and CLOSE.startswith(body[end:].lstrip()) else _MALFORMED
