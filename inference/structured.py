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

one block per call, blocks separated by a newline. Each tool's `parameters` are compiled as a
JSON schema of their own (a `$ref` in them resolves against them), and a schema with no finite
value (a `$ref` cycle with no way out) is refused like any other uncompilable one. This module
imports llguidance, never torch: the web process uses it.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
import urllib.parse
from collections import deque
from collections.abc import Sequence
from typing import Any

import llguidance

HERMES = "hermes"
TOOL_CALL_FORMATS = (HERMES,)

# Compact JSON: no free whitespace, so a model cannot pad an answer with blanks until it runs
# out of tokens, and the default separators "," and ":".
_JSON_OPTIONS = {"whitespace_flexible": False}
_CALL_OPEN, _CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"
_CALL_BLOCK = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
# A call's JSON as the grammar writes it: `{"name":"f","arguments":{…}}`.
_CALL_HEAD, _CALL_ARGUMENTS = '{"name":', ',"arguments":'
_TOO_DEEP = "the schema nests deeper than structured outputs support"
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
    """A `%json` rule enforcing `schema`; raises GrammarError when no finite value matches it
    (every schema of a grammar comes through here: the upload check and the run alike)."""
    try:
        # Our compile options replace any the schema brings: they are not JSON Schema.
        text = json.dumps({**schema, "x-guidance": _JSON_OPTIONS}, ensure_ascii=False)
        _require_finite(text)
    except RecursionError:
        # Far past what the compiler takes (it refuses JSON nested some 100 levels deep).
        raise GrammarError(_TOO_DEEP, unsupported=True) from None
    return "%json " + text


def _calls_rule(tools: list[dict[str, Any]], *, parallel: bool) -> list[str]:
    # One alternative per tool: its name as a literal, its parameters as a schema of their own
    # (so their local `$ref`s resolve against them), in the compact `{"name":…,"arguments":…}`.
    lines = [
        'calls: call ("\\n" call)*' if parallel else "calls: call",
        f"call: {json.dumps(_CALL_OPEN)} call_body {json.dumps(_CALL_CLOSE)}",
        "call_body: " + " | ".join(f"call_{i}" for i in range(len(tools))),
    ]
    for i, tool in enumerate(tools):
        head = _CALL_HEAD + json.dumps(tool["function"]["name"]) + _CALL_ARGUMENTS
        lines.append(f'call_{i}: {json.dumps(head)} arguments_{i} "}}"')
        lines.append(f"arguments_{i}: {_json_rule(function_schema(tool))}")
    return lines


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
    if "recursion limit exceeded" in error:
        return GrammarError(_TOO_DEEP, unsupported=True)
    if "regex parse error" in error:
        return GrammarError(
            "a pattern in the schema is not a valid regular expression", unsupported=False
        )
    return GrammarError(
        "the schema is not a valid JSON Schema that structured outputs can enforce",
        unsupported=False,
    )


# -- schemas no finite value matches ----------------------------------------------------------

_MISSING = object()


@functools.lru_cache(maxsize=256)
def _require_finite(schema_text: str) -> None:
    """Raise GrammarError when no finite JSON value can match the schema: a `$ref` cycle that
    every branch must take again (`{"$ref": "#"}`, a required property of the definition's own
    type, an array of at least one of them). The grammar compiler accepts such a schema, and
    its output could then never end but by `max_tokens`, or could not start at all."""
    # Cached like _validate: a file's lines usually share one schema.
    if not _can_end(json.loads(schema_text)):
        raise GrammarError(
            "no finite JSON value matches the schema: its $ref recursion has no way to end "
            "(make the recursive property optional, let the array be empty, or add an anyOf "
            "branch without the reference)",
            unsupported=False,
        )


def _can_end(root: Any) -> bool:
    """Whether a finite value can match `root`, as far as its local `$ref`s decide.

    The least fixed point of "this reference's target has a finite value" (as a grammar's
    productive rules are found): no reference is finite at first; a target is judged with what
    is known, and judged again only when a reference it mentions becomes finite. What this does
    not model counts as finite: it refuses only a schema that certainly has no value, and the
    compiler judges the rest.
    """
    judge = _Finiteness(root)
    dependents: dict[str, set[str]] = {ref: set() for ref in judge.refs}
    for ref, target in judge.refs.items():
        for mentioned in _local_refs(target) & judge.refs.keys():
            dependents[mentioned].add(ref)
    queue = deque(judge.refs)
    queued = set(queue)
    while queue:
        ref = queue.popleft()
        queued.discard(ref)
        if ref in judge.finite or not judge.ends(judge.refs[ref]):
            continue
        judge.finite.add(ref)
        for dependent in dependents[ref] - judge.finite - queued:
            queue.append(dependent)
            queued.add(dependent)
    return judge.ends(root)


class _Finiteness:
    """Judges schema nodes of one document, given the references known to be finite."""

    def __init__(self, root: Any) -> None:
        self.refs = {
            ref: target
            for ref in _local_refs(root)
            if (target := _resolve(root, ref)) is not _MISSING
        }
        self.finite: set[str] = set()

    def ends(self, node: Any) -> bool:
        """Whether a finite value can match `node` (references not yet finite count as not)."""
        if isinstance(node, bool):
            return node
        if not isinstance(node, dict):
            return True
        if "const" in node or "enum" in node:
            return True  # the value is one of the literals given
        ref = node.get("$ref")
        if isinstance(ref, str) and ref in self.refs and ref not in self.finite:
            return False
        all_of, any_of, one_of = node.get("allOf"), node.get("anyOf"), node.get("oneOf")
        if isinstance(all_of, list) and not all(self.ends(sub) for sub in all_of):
            return False
        for branches in (any_of, one_of):
            if isinstance(branches, list) and branches and not any(map(self.ends, branches)):
                return False
        kind = node.get("type")
        kinds = [kind] if isinstance(kind, str) else kind
        if not isinstance(kinds, list):
            return True  # any type: null ends it
        return any(self._type_ends(node, kind) for kind in kinds)

    def _type_ends(self, node: dict[str, Any], kind: Any) -> bool:
        if kind == "object":
            properties = node.get("properties")
            properties = properties if isinstance(properties, dict) else {}
            required = node.get("required")
            for name in required if isinstance(required, list) else ():
                if name in properties:
                    sub = properties[name]
                elif "patternProperties" in node:
                    continue  # which pattern names it is not modelled
                else:
                    sub = node.get("additionalProperties", True)
                if not self.ends(sub):
                    return False
            return True
        if kind == "array":
            least = node.get("minItems", 0)
            least = least if isinstance(least, int) and not isinstance(least, bool) else 0
            prefix, items = node.get("prefixItems"), node.get("items")
            if isinstance(items, list):  # the older tuple form
                prefix, items = items, node.get("additionalItems")
            prefix = prefix if isinstance(prefix, list) else []
            if not all(self.ends(sub) for sub in prefix[:least]):
                return False
            return least <= len(prefix) or items is None or self.ends(items)
        return True


def _local_refs(node: Any) -> set[str]:
    """Every `$ref` of the document that points into it (`#`, `#/$defs/…`, `#/properties/…`)."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
                found.add(ref)
            stack.extend(v for k, v in item.items() if k not in _DATA_KEYWORDS)
        elif isinstance(item, list):
            stack.extend(item)
    return found


# Keywords whose values are JSON data, not schemas.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def _resolve(root: Any, ref: str) -> Any:
    """The node a local JSON-pointer reference names, or _MISSING."""
    node = root
    for part in ref[2:].split("/") if ref != "#" else ():
        part = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


# -- reading tool calls back ------------------------------------------------------------------


def parse_tool_calls(
    text: str, *, seed: str, names: Sequence[str] = ()
) -> list[dict[str, Any]] | None:
    """The tool calls of an output that is tool calls (hermes syntax), in the Chat Completions
    shape with ids derived from `seed`; None when the output is not tool calls (free text, a
    JSON answer). Markup of the syntax never comes back as text.

    An output cut by `max_tokens` keeps its complete calls, and the cut call comes back with
    the arguments written so far (a string, possibly not JSON yet, as the reference gives it).
    Its name is the one written, or else the only one of `names` (the functions the grammar
    allowed) that begins with what was written of it; a call cut before its name is known is
    left out, so a reply cut that early may hold no call at all (an empty list).
    """
    stripped = text.lstrip()
    if not (stripped.startswith(_CALL_OPEN) or (stripped and _CALL_OPEN.startswith(stripped))):
        return None
    calls: list[tuple[str, str]] = []
    position = 0
    for match in _CALL_BLOCK.finditer(stripped):
        if stripped[position : match.start()].strip():
            return None
        position = match.end()
        call = _read_call(match.group(1))
        if call is None:
            return None
        calls.append(call)
    tail = stripped[position:].lstrip()  # a cut string argument keeps its trailing blanks
    if tail:
        cut = _read_cut_call(tail, names)
        if cut is _MALFORMED:
            return None
        if isinstance(cut, tuple):
            calls.append(cut)
    return [
        {
            "id": "call_" + hashlib.sha256(f"{seed}:{index}".encode()).hexdigest()[:24],
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        for index, (name, arguments) in enumerate(calls)
    ]


_MALFORMED = object()


def _read_call(body: str) -> tuple[str, str] | None:
    """(name, arguments) of one complete call's JSON; None when it is not one."""
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False, separators=(",", ":"))
    return call["name"], arguments


def _read_cut_call(tail: str, names: Sequence[str]) -> tuple[str, str] | object | None:
    """(name, arguments so far) of the call an output was cut in; None when its name is not
    known yet; _MALFORMED when `tail` is not the start of a call."""
    if len(tail) <= len(_CALL_OPEN):
        return _cut_name("", names) if _CALL_OPEN.startswith(tail) else _MALFORMED  # in the tag
    if not tail.startswith(_CALL_OPEN):
        return _MALFORMED
    body = tail[len(_CALL_OPEN) :]
    # Compact JSON holds no raw newline: one ends the call's JSON, and begins its closing tag.
    body, newline, closing = body.partition("\n")
    whole = _read_call(body)
    if newline:
        return whole if whole is not None and _CALL_CLOSE.startswith("\n" + closing) else _MALFORMED
    if whole is not None:
        return whole
    head = _CALL_HEAD + '"'
    if len(body) <= len(head):
        return _cut_name("", names) if head.startswith(body) else _MALFORMED
    if not body.startswith(head):
        return _MALFORMED
    written, quote, after = body[len(head) :].partition('"')
    if not quote:
        return _cut_name(written, names)
    if len(after) <= len(_CALL_ARGUMENTS):
        return (written, "") if _CALL_ARGUMENTS.startswith(after) else _MALFORMED
    if not after.startswith(_CALL_ARGUMENTS):
        return _MALFORMED
    return written, after[len(_CALL_ARGUMENTS) :]


def _cut_name(written: str, names: Sequence[str]) -> tuple[str, str] | None:
    """(the only name of `names` that begins with `written`, no arguments), or None."""
    matching = [name for name in names if name.startswith(written)]
    return (matching[0], "") if len(matching) == 1 else None
