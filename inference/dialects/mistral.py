"""Mistral tool calls, after the control token `[TOOL_CALLS]` (kept in the decoded text: it is
markup). Two syntaxes, as the two chat templates render an earlier call (and mistral-common's
tokenizers encode one):

- `mistral` (Mistral Nemo, tokenizer v3): one JSON list of every call, each object with its
  `name` and `arguments` (Nemo also writes the call's `id`; it is read and dropped, Boardwalk
  gives each call its own id):

      [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]

- `mistral_v11` (Mistral Small 3.2, tokenizer v11): each call on its own, the name as text,
  then the control token `[ARGS]` and the arguments' JSON; the template renders the call id
  after the name (`[CALL_ID]id`), which the model may copy: it is read and dropped.

      [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}

Both templates refuse a call id that is not 9 letters or digits; Boardwalk's ids are longer,
so an earlier turn's ids (and the tool results' `tool_call_id`) reach the template as 9 hex
digits of their hash (`MistralDialect.template_messages`).

Under tool_choice auto, text may come before the calls (the models write some). Neither
template knows a developer role (Small 3.2's refuses it, Nemo's refuses any role but a first
system message): such a message reaches them as a system message.

The grammars write the markers as the tokens they are (`<[id]>` in llguidance's Lark: their
names are not of the `<…>` form), the names as literals and the arguments compactly, each
held to its function's `parameters`; they never write a call id. Reading accepts any JSON
layout and a blank after `[TOOL_CALLS]`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inference.structured import function_schema, json_rule

from .base import Dialect, Marks, ToolSyntax, compact
from .hermes import cut_name
from .llama3 import call_of, is_malformed, read_cut_object

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_DECODER = json.JSONDecoder()
_TEMPLATE_ID = re.compile(r"[A-Za-z0-9]{9}")


@dataclass(frozen=True)
class MistralDialect(Dialect):
    """Mistral: its templates take call ids of 9 letters or digits only."""

    def template_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for message in super().template_messages(messages):
            if message.get("tool_calls"):
                calls = [
                    {**call, "id": template_id(call.get("id"))} for call in message["tool_calls"]
                ]
                message = {**message, "tool_calls": calls}
            if message.get("role") == "tool" and "tool_call_id" in message:
                message = {**message, "tool_call_id": template_id(message["tool_call_id"])}
            out.append(message)
        return out


def template_id(call_id: Any) -> str:
    """A call id as Mistral's templates take it: itself when 9 letters or digits, else 9 hex
    digits of its hash (the same for the call and for its result)."""
    if isinstance(call_id, str) and _TEMPLATE_ID.fullmatch(call_id):
        return call_id
    return hashlib.sha256(str(call_id).encode()).hexdigest()[:9]


class MistralCalls(ToolSyntax):
    """Mistral Nemo: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}` objects."""

    name = "mistral"
    trigger = TOOL_CALLS
    markup = (TOOL_CALLS,)
    text_before_calls = True

    def calls_rules(
        self, tools: list[dict[str, Any]], *, parallel: bool, marks: Marks
    ) -> list[str]:
        listed = 'call ("," call)*' if parallel else "call"
        lines = [
            f'calls: {marks(TOOL_CALLS)} "[" {listed} "]"',
            "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
        ]
        for i, tool in enumerate(tools):
            head = '{"name":' + json.dumps(tool["function"]["name"]) + ',"arguments":'
            lines.append(f'call_{i}: {json.dumps(head)} arguments_{i} "}}"')
            lines.append(f"arguments_{i}: {json_rule(function_schema(tool))}")
        return lines

    def read_calls(self, text: str, names: Sequence[str]) -> list[tuple[str, str]] | None:
        if not text.startswith(TOOL_CALLS):
            return _cut_in_marker(text, names)
        rest = text[len(TOOL_CALLS) :].lstrip()
        if not rest:
            return _named([cut_name("", names)])
        if not rest.startswith("["):
            return None
        calls: list[tuple[str, str]] = []
        position = 1
        while True:
            position = _skip_blanks(rest, position)
            if calls:  # after a call: a comma, the list's end, or the cut
                if position == len(rest):
                    return calls
                if rest[position] == "]":
                    return calls if not rest[position + 1 :].strip() else None
                if rest[position] != ",":
                    return None
                position = _skip_blanks(rest, position + 1)
            if position == len(rest):
                return calls
            try:
                value, position = _DECODER.raw_decode(rest, position)
            except ValueError:  # cut by max_tokens, or not a call
                cut = read_cut_object(rest[position:], names, ("arguments", "parameters"))
                if is_malformed(cut):
                    return None
                return calls + _named([cut])
            call = call_of(value, names)
            if call is None:
                return None
            calls.append(call)


class MistralV11Calls(ToolSyntax):
    """Mistral Small 3.2: `[TOOL_CALLS]name[ARGS]{…}` per call."""

    name = "mistral_v11"
    trigger = TOOL_CALLS
    markup = (TOOL_CALLS, ARGS, CALL_ID)
    text_before_calls = True

    def calls_rules(
        self, tools: list[dict[str, Any]], *, parallel: bool, marks: Marks
    ) -> list[str]:
        lines = [
            "calls: call+" if parallel else "calls: call",
            f"call: {marks(TOOL_CALLS)} ("
            + " | ".join(f"call_{i}" for i in range(len(tools)))
            + ")",
        ]
        for i, tool in enumerate(tools):
            name = json.dumps(tool["function"]["name"])
            lines.append(f"call_{i}: {name} {marks(ARGS)} arguments_{i}")
            lines.append(f"arguments_{i}: {json_rule(function_schema(tool))}")
        return lines

    def read_calls(self, text: str, names: Sequence[str]) -> list[tuple[str, str]] | None:
        if not text.startswith(TOOL_CALLS):
            return _cut_in_marker(text, names)
        pieces = text[len(TOOL_CALLS) :].split(TOOL_CALLS)
        calls: list[tuple[str, str]] = []
        for index, piece in enumerate(pieces):
            last = index == len(pieces) - 1
            head, args_mark, arguments = piece.partition(ARGS)
            name, id_mark, _ = head.partition(CALL_ID)
            name = name.strip()
            if not args_mark:  # cut before the arguments
                if not last:
                    return None
                if id_mark:
                    return [*calls, (name, "")] if name in names else None
                if not any(known.startswith(name) for known in names):
                    return None
                return calls + _named([cut_name(name, names)])
            if name not in names:
                return None
            arguments = arguments.lstrip()
            try:
                value, end = _DECODER.raw_decode(arguments)
            except ValueError:  # cut by max_tokens inside the arguments, or malformed
                if not last:
                    return None
                return [*calls, (name, arguments)]
            if arguments[end:].strip():
                return None
            if isinstance(value, dict):
                calls.append((name, compact(value)))
            elif isinstance(value, str):  # arguments written as a JSON string
                calls.append((name, value))
            else:
                return None
        return calls


def _cut_in_marker(text: str, names: Sequence[str]) -> list[tuple[str, str]] | None:
    """The calls of a reply cut inside `[TOOL_CALLS]` written as text (the shared reader
    hands it over when all of it begins the trigger)."""
    if text.strip() and TOOL_CALLS.startswith(text.strip()):
        return _named([cut_name("", names)])
    return None


def _named(cuts: list[Any]) -> list[tuple[str, str]]:
    return [cut for cut in cuts if isinstance(cut, tuple)]


def _skip_blanks(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position
