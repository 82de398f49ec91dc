"""Llama 3.1, 3.2 and 3.3 tool calls: a bare JSON object per call, the function's arguments
under `parameters`, as their chat templates render an earlier call and ask for one:

    {"name": "get_weather", "parameters": {"city": "Paris"}}

The reply ends with `<|eot_id|>` (or `<|eom_id|>` after a call, in Meta's "ipython" mode):
neither is in the text read.

Choices made here (the templates leave them open):

- The calls begin at `{"name"` (the trigger), not at any `{`: an answer that merely holds JSON
  or code is not held back while streamed, nor read as a call. A complete object is a call
  only when its name is one of the request's functions and it carries `parameters` (or
  `arguments`), so a JSON answer that happens to have a "name" stays content.
- `<|python_tag|>` is not markup: Llama 3.1 may write it before a JSON call, but Boardwalk
  offers no built-in tools (the only calls written after it in Meta's format), so the decoder
  drops it like any other special token and the call reads the same either way. Grammars never
  write it.
- Parallel calls: the templates render one call per turn (they refuse several). Several calls
  are written as vLLM's llama3_json reads them, objects separated by `; `; reading also takes
  objects separated by blanks only. An earlier turn with several calls is handed to the
  template as one assistant turn per call, each followed by its tool results
  (`Llama3Dialect.template_messages`).

The grammar writes each call compactly (`{"name":"f","parameters":{…}}`), the whole object as
one JSON schema (the name a `const`, then the function's `parameters`): a call and a JSON answer
both begin with `{`, and llguidance only lets two JSON schemas share their first bytes, not a
literal and a schema. For the same reason, under tool_choice auto the reply is either text
(which never writes `{"name"`, so no call escapes its schema) or the calls, not both (a text
lexeme and a schema cannot begin at the same place). Reading still takes text before calls.
Reading accepts any JSON layout, including the template's own
(`{"name": "f", "parameters": {…}}`).

The templates know no developer role (they would render it as an unknown header): such a
message reaches them as a system message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inference.structured import function_schema, json_rule

from .base import Dialect, Marks, ToolSyntax, compact
from .hermes import cut_name

SEPARATOR = "; "
_DECODER = json.JSONDecoder()
_MALFORMED = object()
# Keys a call object may hold ("id": Mistral Nemo writes its call ids in the object).
_CALL_KEYS = frozenset({"name", "parameters", "arguments", "type", "id"})


class Llama3Json(ToolSyntax):
    name = "llama3_json"
    trigger = '{"name"'
    markup = ()

    def calls_rules(
        self, tools: list[dict[str, Any]], *, parallel: bool, marks: Marks
    ) -> list[str]:
        lines = [
            f"calls: call ({json.dumps(SEPARATOR)} call)*" if parallel else "calls: call",
            "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
        ]
        for i, tool in enumerate(tools):
            name, parameters = tool["function"]["name"], function_schema(tool)
            whole = call_schema(name, parameters)
            if whole is not None:
                lines.append(f"call_{i}: {json_rule(whole)}")
                continue
            head = '{"name":' + json.dumps(name) + ',"parameters":'
            lines.append(f'call_{i}: {json.dumps(head)} arguments_{i} "}}"')
            lines.append(f"arguments_{i}: {json_rule(parameters)}")
        return lines

    def read_calls(self, text: str, names: Sequence[str]) -> list[tuple[str, str]] | None:
        calls: list[tuple[str, str]] = []
        position = 0
        while True:
            position = _skip_blanks(text, position)
            if calls and text.startswith(";", position):
                position = _skip_blanks(text, position + 1)
            if position == len(text):
                return calls
            try:
                value, position = _DECODER.raw_decode(text, position)
            except ValueError:  # cut by max_tokens, or not a call
                cut = read_cut_object(text[position:], names, ("parameters", "arguments"))
                if cut is _MALFORMED:
                    return None
                if isinstance(cut, tuple):
                    calls.append(cut)
                return calls
            call = call_of(value, names)
            if call is None:
                return None
            calls.append(call)


@dataclass(frozen=True)
class Llama3Dialect(Dialect):
    """Llama 3.x: its templates render one call per assistant turn; free text never begins
    a call."""

    def template_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return one_call_per_turn(super().template_messages(messages))

    def free_text_rule(self) -> str:
        """Text under tool_choice auto: not beginning with `{` (a reply that does is the
        calls) and never writing `{"name"`, so that no call escapes its schema inside text."""
        return 'TEXT: /([^{](.|\\n)*)?/ & ~/(.|\\n)*\\{"name"(.|\\n)*/'


def one_call_per_turn(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with each assistant turn of several calls split into a turn per call, each
    followed by the tool results that answer it (by `tool_call_id`; results that answer none
    follow the last). An empty `tool_calls` is dropped (the templates read its mere presence
    as a call)."""
    out: list[dict[str, Any]] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        index += 1
        if message.get("role") != "assistant" or "tool_calls" not in message:
            out.append(message)
            continue
        calls = message.get("tool_calls") or []
        if len(calls) <= 1:
            if not calls:
                message = {k: v for k, v in message.items() if k != "tool_calls"}
            out.append(message)
            continue
        results = []
        while index < len(messages) and messages[index].get("role") == "tool":
            results.append(messages[index])
            index += 1
        for call in calls:
            out.append({**message, "tool_calls": [call]})
            answering = [r for r in results if r.get("tool_call_id") == call.get("id")]
            out += answering
            results = [r for r in results if r not in answering]
        out += results
    return out


def call_schema(name: str, parameters: Any) -> dict[str, Any] | None:
    """One call's JSON as a schema of its own: `{"name": <name>, "parameters": <parameters>}`
    in that order, the definitions of `parameters` moved to its root so that their `$ref`s
    still resolve. None when `parameters` refers elsewhere in itself (the grammar then writes
    the name as a literal and the parameters as their own schema)."""
    if not isinstance(parameters, dict) or not _local_refs_only(parameters):
        return None
    inner = {k: v for k, v in parameters.items() if k not in ("$defs", "definitions", "$schema")}
    hoisted = {k: parameters[k] for k in ("$defs", "definitions") if k in parameters}
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "parameters": inner},
        "required": ["name", "parameters"],
        "additionalProperties": False,
        **hoisted,
    }


def _local_refs_only(node: Any) -> bool:
    """Whether every `$ref` (and no `$id`) in `node` points into `#/$defs` or
    `#/definitions`."""
    if isinstance(node, list):
        return all(_local_refs_only(item) for item in node)
    if not isinstance(node, dict):
        return True
    if "$id" in node:
        return False
    ref = node.get("$ref")
    if isinstance(ref, str) and not ref.startswith(("#/$defs/", "#/definitions/")):
        return False
    return all(_local_refs_only(value) for value in node.values())


def call_of(value: Any, names: Sequence[str]) -> tuple[str, str] | None:
    """(name, arguments as compact JSON) of a decoded call object `{"name": …, "parameters":
    …}` (or `arguments`) naming one of `names`; None when it is not one."""
    if not isinstance(value, dict) or not set(value) <= _CALL_KEYS:
        return None
    name = value.get("name")
    if not isinstance(name, str) or name not in names:
        return None
    if "parameters" in value:
        arguments = value["parameters"]
    elif "arguments" in value:
        arguments = value["arguments"]
    else:
        return None
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        return name, arguments
    if not isinstance(arguments, dict):
        return None
    return name, compact(arguments)


def read_cut_object(
    body: str, names: Sequence[str], keys: Sequence[str]
) -> tuple[str, str] | object | None:
    """(name, arguments so far) of a call object cut by `max_tokens`, in any JSON layout, its
    name first and its arguments under one of `keys`: None while its name is not known,
    _MALFORMED when `body` does not begin such a call (or names no function of `names`)."""
    rest = body
    for piece in ("{", '"name"', ":", '"'):
        rest = rest.lstrip()
        if len(rest) < len(piece):
            return cut_name("", names) if piece.startswith(rest) else _MALFORMED
        if not rest.startswith(piece):
            return _MALFORMED
        rest = rest[len(piece) :]
    written, quote, rest = rest.partition('"')
    if not quote:
        return cut_name(written, names) if _begins_a_name(written, names) else _MALFORMED
    if written not in names:
        return _MALFORMED
    rest = rest.lstrip()
    if not rest:
        return written, ""
    if not rest.startswith(","):
        return _MALFORMED
    rest = rest[1:].lstrip()
    quoted = [json.dumps(key) for key in keys]
    if any(key.startswith(rest) for key in quoted):
        return written, ""
    key = next((key for key in quoted if rest.startswith(key)), None)
    if key is None:
        return _MALFORMED
    rest = rest[len(key) :].lstrip()
    if not rest:
        return written, ""
    if not rest.startswith(":"):
        return _MALFORMED
    rest = rest[1:].lstrip()
    try:  # arguments written whole, the object cut after them (Nemo writes an id there)
        value, _ = _DECODER.raw_decode(rest)
    except ValueError:
        return written, rest
    return written, value if isinstance(value, str) else compact(value)


def is_malformed(value: object) -> bool:
    return value is _MALFORMED


def _begins_a_name(written: str, names: Sequence[str]) -> bool:
    return any(name.startswith(written) for name in names)


def _skip_blanks(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position
