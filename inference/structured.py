"""Structured outputs: JSON schemas to llguidance grammar rules, and checks that they compile.

`response_format` (`json_object`, `json_schema`) and each tool's `parameters` become `%json`
rules of llguidance's Lark dialect; the revision's dialect (inference/dialects) puts them in
the grammar of a whole reply, in its own syntax. The engine keeps every row that carries a
grammar inside it, token by token (inference/engine/constraints.py), so a completed answer
always parses and validates. The upload validator compiles the same rules, so a schema that
cannot be enforced is refused at upload (docs/API.md "Structured outputs"), never at run time.

A schema with no finite value (a `$ref` cycle with no way out) is refused like any other
uncompilable one. This module imports llguidance, never torch: the web process uses it.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import urllib.parse
from collections import deque
from collections.abc import Mapping
from typing import Any

import llguidance

# Compact JSON: no free whitespace, so a model cannot pad an answer with blanks until it runs
# out of tokens, and the default separators "," and ":".
_JSON_OPTIONS = {"whitespace_flexible": False}
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


def tool_choice_mode(body: Mapping[str, Any]) -> tuple[str, str | None]:
    """(mode, named function) of a body with tools: mode is none | auto | required | function."""
    choice = body.get("tool_choice")
    if choice is None:
        return "auto", None
    if isinstance(choice, str):
        return choice, None
    return "function", choice["function"]["name"]


def json_rule(schema: dict[str, Any]) -> str:
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


def lark(lines: list[str]) -> str:
    return llguidance.LLMatcher.grammar_from_lark("%llguidance {}\n" + "\n".join(lines) + "\n")


def validate(grammar: str) -> None:
    """Raise GrammarError unless `grammar` compiles (cached: a file's lines usually share
    one schema, and a compile costs milliseconds)."""
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
