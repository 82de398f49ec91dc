"""Structured outputs and tool calls: request fields to an llguidance grammar, and back.

`response_format` (`json_object`, `json_schema`) and `tools` with `tool_choice` become one
grammar (llguidance's Lark dialect with inline JSON schemas); the engine keeps every row that
carries one inside it, token by token (inference/engine/constraints.py), so a completed output
always parses and validates. The upload validator compiles the same grammar, so a schema that
cannot be enforced is refused at upload (SPEC §4.1), never at run time.

Tool calls use the revision's tool-call syntax (`ModelRevision.tool_call_format`). One syntax
is implemented, "hermes" (Qwen 2.5, Hermes and the demo model):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call, blocks separated by a newline. This module imports llguidance, never
torch: the web process uses it.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import llguidance

HERMES = "hermes"
TOOL_CALL_FORMATS = (HERMES,)

# Compact JSON: no free whitespace, so a model cannot pad an answer with blanks until it runs
# out of tokens, and the default separators "," and ":".
_JSON_OPTIONS = {"whitespace_flexible": False}
_CALL_OPEN, _CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"
_CALL_BLOCK = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
# Keywords named back in an error message only when they look like keywords (never content).
_KEYWORD = re.compile(r"[A-Za-z$][A-Za-z0-9_$]{0,63}")


class GrammarError(ValueError):
    """A schema or tool list that cannot be turned into an enforceable grammar.

    `unsupported` is True when the schema is valid JSON Schema but uses a feature the grammar
    compiler does not implement. `message` never quotes the schema's content.
    """

    def __init__(self, message: str, *, unsupported: bool) -> None:
        super().__init__(message)
        self.message = message
        self.unsupported = unsupported


@dataclass(frozen=True)
class ToolSpec:
    """What the completion needs to know about a request's tools."""

    tool_choice: str  # "auto" | "required" | "function" | "none"


def strict_schema(schema: Any) -> Any:
    """The schema as OpenAI strict mode reads it: every object closed (`additionalProperties:
    false`) and every property required, at every depth."""
    schema = copy.deepcopy(schema)
    _close(schema)
    return schema


def _close(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _close(item)
        return
    if not isinstance(node, dict):
        return
    properties = node.get("properties")
    if node.get("type") == "object" or isinstance(properties, dict):
        node.setdefault("additionalProperties", False)
        if isinstance(properties, dict):
            node["required"] = list(properties)
    for key, value in node.items():
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(
            value, dict
        ):
            for sub in value.values():
                _close(sub)
        elif key not in ("enum", "const", "default", "examples", "required"):
            _close(value)


def response_schema(response_format: Any) -> Any | None:
    """The JSON schema a `response_format` asks for; None for text (or no format)."""
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema")
        if schema is None:
            schema = {}  # the reference allows omitting it: any JSON value
        if not isinstance(schema, dict):
            raise GrammarError("the schema must be a JSON object", unsupported=False)
        return strict_schema(schema) if spec.get("strict") else schema
    return None


def function_schema(tool: dict[str, Any]) -> Any:
    """The JSON schema of one function tool's arguments (strict mode applied)."""
    function = tool["function"]
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    return strict_schema(parameters) if function.get("strict") else parameters


def tool_choice_mode(body: dict[str, Any]) -> tuple[str, str | None]:
    """(mode, named function) of a body with tools: mode is none | auto | required | function."""
    choice = body.get("tool_choice")
    if choice is None:
        return "auto", None
    if isinstance(choice, str):
        return choice, None
    return "function", choice["function"]["name"]


def _json_rule(schema: dict[str, Any]) -> str:
    # Our compile options replace any the schema brings: they are not JSON Schema.
    return "%json " + json.dumps({**schema, "x-guidance": _JSON_OPTIONS}, ensure_ascii=False)


def _calls_rule(tools: list[dict[str, Any]], *, parallel: bool) -> list[str]:
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool["function"]["name"]},
                "arguments": function_schema(tool),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    call = variants[0] if len(variants) == 1 else {"anyOf": variants}
    return [
        'calls: call ("\\n" call)*' if parallel else "calls: call",
        f"call: {json.dumps(_CALL_OPEN)} call_body {json.dumps(_CALL_CLOSE)}",
        f"call_body: {_json_rule(call)}",
    ]


def grammar_for(body: dict[str, Any], *, tool_call_format: str = HERMES) -> str | None:
    """The llguidance grammar a request body asks for; None when its output is free text.

    Raises GrammarError when the body's schemas cannot be compiled (the validator calls
    `check_grammar` to turn that into an upload error).
    """
    schema = response_schema(body.get("response_format"))
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    mode, named = tool_choice_mode(body) if tools else ("none", None)
    if mode == "function":
        tools = [t for t in tools if t["function"]["name"] == named]
    if mode == "none" or not tools:
        if schema is None:
            return None
        return _lark(["start: answer", f"answer: {_json_rule(schema)}"])
    if tool_call_format != HERMES:
        raise GrammarError(
            f"tool-call format {tool_call_format} is not implemented", unsupported=True
        )
    parallel = mode != "function" and body.get("parallel_tool_calls") is not False
    lines = _calls_rule(tools, parallel=parallel)
    if mode in ("required", "function"):
        lines.insert(0, "start: calls")
    elif schema is not None:
        # JSON starts with anything but "<", a call with "<tool_call>": the first byte decides.
        lines[:0] = ["start: answer | calls", f"answer: {_json_rule(schema)}"]
    else:
        # Free text that does not start like a tool call, or tool calls.
        lines[:0] = ["start: TEXT | calls", "TEXT: /([^<](.|\\n)*)?/"]
    return _lark(lines)


def _lark(lines: list[str]) -> str:
    return llguidance.LLMatcher.grammar_from_lark("%llguidance {}\n" + "\n".join(lines) + "\n")


def check_grammar(body: dict[str, Any], *, tool_call_format: str = HERMES) -> None:
    """Raise GrammarError unless the body's grammar compiles (a no-op for free-text bodies)."""
    grammar = grammar_for(body, tool_call_format=tool_call_format)
    if grammar is not None:
        _validate(grammar)


@functools.lru_cache(maxsize=256)
def _validate(grammar: str) -> None:
    # Cached: a file's lines usually share one schema, and a compile costs milliseconds.
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        raise _explain(messages[0] if messages else "")


def _explain(error: str) -> GrammarError:
    unimplemented = re.search(r"Unimplemented keys: \[([^\]]*)\]", error)
    if unimplemented:
        names = re.findall(r'"([^"]*)"', unimplemented.group(1))
        shown = [n for n in names if _KEYWORD.fullmatch(n)]
        what = f"the keyword(s) {', '.join(shown)}" if shown else "a keyword"
        return GrammarError(
            f"the schema uses {what}, which structured outputs do not support", unsupported=True
        )
    if "look-around" in error or "backreferences" in error:
        return GrammarError(
            "a pattern in the schema uses look-around or backreferences, which structured "
            "outputs do not support",
            unsupported=True,
        )
    if "Unknown format" in error:
        return GrammarError(
            "the schema uses a string format that structured outputs do not support",
            unsupported=True,
        )
    if "retrieving it failed" in error or "not present in a registry" in error:
        return GrammarError(
            "the schema refers ($ref) to a definition it does not contain; only local "
            "references (#/...) are supported",
            unsupported=True,
        )
    if "regex parse error" in error:
        return GrammarError(
            "a pattern in the schema is not a valid regular expression", unsupported=False
        )
    return GrammarError(
        "the schema is not a valid JSON Schema that structured outputs can enforce",
        unsupported=False,
    )


# -- reading tool calls back ------------------------------------------------------------------


def parse_tool_calls(text: str, *, seed: str) -> list[dict[str, Any]] | None:
    """The tool calls of an output that starts with them (hermes syntax), in the Chat
    Completions shape with ids derived from `seed`; None when the output holds no tool call.

    Only complete, well-formed blocks count: a reply cut by `max_tokens` mid-call is text.
    """
    stripped = text.lstrip()
    if not stripped.startswith("<tool_call>"):
        return None
    calls: list[dict[str, Any]] = []
    position = 0
    for match in _CALL_BLOCK.finditer(stripped):
        if stripped[position : match.start()].strip():
            return None
        position = match.end()
        try:
            call = json.loads(match.group(1))
        except ValueError:
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        digest = hashlib.sha256(f"{seed}:{len(calls)}".encode()).hexdigest()[:24]
        calls.append(
            {
                "id": f"call_{digest}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(call.get("arguments", {}), ensure_ascii=False),
                },
            }
        )
    if not calls or stripped[position:].strip():
        return None
    return calls
