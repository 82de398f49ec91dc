"""Qwen3-Coder tool calls: XML-like blocks, one parameter per element, each value on lines of
its own.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

Parallel calls follow each other separated by a newline (`</tool_call>\\n<tool_call>`); text
before the first call is the answer's content. This is how Qwen3-Coder's chat template writes
an earlier turn's calls. `<tool_call>` and `</tool_call>` are single tokens of Qwen's vocabulary
(the syntax's markup); `<function=…>` and `<parameter=…>` are plain text.

A value is raw text for a string parameter and JSON otherwise. The grammar writes each
parameter by its property schema: a string property as text that never holds `</parameter>`
(its `enum` or `const` as those strings, its `pattern` enforced; with `minLength` or
`maxLength`, on one line without `<`; `format`, an annotation, is not enforced), any other
property as compact JSON of its schema (a `$ref` to the function's `$defs` resolved). Every
property is written in the schema's order, the required ones always and the others
optionally, so the arguments hold every required property.

Reading gets the names of the functions only, not their schemas: a value is taken as JSON
when it parses as JSON other than a string (`3`, `true`, `null`, `[1, 2]`, `{"a": 1}`), and as
the text written otherwise (a quoted `"x"` stays the three characters). So a string parameter
whose text happens to be JSON (`42`, `true`) reads back as that JSON value. The arguments come
back as a compact JSON object of the parameters in the order written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from inference.structured import function_schema, json_rule

from .base import Marks, ToolSyntax, _without_partial, compact
from .hermes import cut_name

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
# A string value and the end of its parameter, as one lexeme (it ends at the first
# `</parameter>`, which no text value holds).
_ANY = "(.|\\n)*"
_NO_END = f"~/{_ANY}<\\/parameter>{_ANY}/"
_END = '"\\n</parameter>"'
_MALFORMED = object()


class Qwen3CoderXml(ToolSyntax):
    name = "qwen3_coder"
    trigger = OPEN
    markup = (OPEN, CLOSE)
    text_before_calls = True  # the content, then the calls

    def calls_rules(
        self, tools: list[dict[str, Any]], *, parallel: bool, marks: Marks
    ) -> list[str]:
        lines = [
            'calls: call ("\\n" call)*' if parallel else "calls: call",
            f'call: {marks(OPEN)} "\\n" call_body "\\n" {marks(CLOSE)}',
            "call_body: " + " | ".join(f"call_{i}" for i in range(len(tools))),
        ]
        texts: list[str] = []  # the lexemes of text values
        for i, tool in enumerate(tools):
            head = _literal(FUNCTION + tool["function"]["name"] + ">\n")
            items = []
            for j, (key, schema, required) in enumerate(_parameters(function_schema(tool))):
                items.append(f"parameter_{i}_{j}" + ("" if required else "?"))
                opening = _literal(PARAMETER + key + ">\n")
                text = _text_schema(schema)
                if text is None:
                    ending = _literal("\n" + PARAMETER_END + "\n")
                    lines.append(f"parameter_{i}_{j}: {opening} value_{i}_{j} {ending}")
                    lines.append(f"value_{i}_{j}: {json_rule(schema)}")
                elif choices := _strings(text):
                    ending = _literal("\n" + PARAMETER_END + "\n")
                    listed = " | ".join(_literal(choice) for choice in choices)
                    lines.append(f"parameter_{i}_{j}: {opening} ({listed}) {ending}")
                else:
                    lexeme = f"TEXT_{i}_{j}"
                    lines.append(f'parameter_{i}_{j}: {opening} {lexeme} "\\n"')
                    texts.append(f"{lexeme}_VALUE: {_text_regex(text)}")
                    texts.append(f"{lexeme}: {lexeme}_VALUE {_END}")
            body = " ".join([head, *items, _literal(FUNCTION_END)])
            lines.append(f"call_{i}: {body}")
        return lines + texts

    def read_calls(self, text: str, names: Sequence[str]) -> list[tuple[str, str]] | None:
        calls: list[tuple[str, str]] = []
        rest = text
        while True:
            rest = rest.lstrip()
            if not rest:
                return calls
            if len(rest) <= len(OPEN) and OPEN.startswith(rest):  # cut in the opening tag
                cut = cut_name("", names)
                return [*calls, cut] if cut is not None else calls
            if not rest.startswith(OPEN):
                return None
            call, rest = _read_call(rest[len(OPEN) :], names)
            if call is _MALFORMED:
                return None
            if isinstance(call, tuple):
                calls.append(call)
            if call is None or not rest.startswith(CLOSE):
                return calls if call is None or not rest.strip() else None
            rest = rest[len(CLOSE) :]


# -- grammar ------------------------------------------------------------------------------


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _parameters(schema: Any) -> list[tuple[str, dict[str, Any], bool]]:
    """(name, schema, required) of each parameter that may be written, in the schema's order
    (required ones the schema does not describe last, with the schema of its other
    properties)."""
    if not isinstance(schema, dict):
        return []
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    required = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
    found = [(key, sub, key in required) for key, sub in properties.items()]
    other = schema.get("additionalProperties", True)
    found += [(key, other, True) for key in required if key not in properties]
    # A property's schema is compiled alone: it keeps the definitions its `$ref`s name.
    shared = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    return [
        (key, {**shared, **(sub if isinstance(sub, dict) else {})}, needed)
        for key, sub, needed in found
        if sub is not False  # a property that may not be written
    ]


def _text_schema(schema: dict[str, Any]) -> dict[str, Any] | None:
    """The schema of a parameter written as raw text (a string one; a local `$ref` followed),
    or None when its value is written as JSON."""
    seen: set[str] = set()
    while isinstance(schema.get("$ref"), str) and schema["$ref"] not in seen:
        seen.add(schema["$ref"])
        target = _resolve(schema, schema["$ref"])
        if not isinstance(target, dict):
            return None
        schema = {**schema, **target, "$ref": target.get("$ref")}
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return schema
    if kind is None and _strings(schema):
        return schema
    return None


def _text_regex(schema: dict[str, Any]) -> str:
    """The text a string parameter may be, as an llguidance lexeme that never holds
    `</parameter>`: its `pattern` (searched, as JSON Schema reads it), and its `minLength` and
    `maxLength` on one line without `<` (a count over any text, intersected with the rest,
    grows past what the lexer builds). `format` is an annotation (JSON Schema 2020-12), not
    enforced."""
    parts = []
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        parts.append(_searched(pattern))
    least, most = schema.get("minLength"), schema.get("maxLength")
    least = least if isinstance(least, int) and not isinstance(least, bool) else 0
    most = most if isinstance(most, int) and not isinstance(most, bool) else None
    if least > 0 or most is not None:
        parts.append(f"/[^<\\n]{{{least},{'' if most is None else most}}}/")
    else:
        parts.append(_NO_END)
    if not isinstance(pattern, str) and parts == [_NO_END]:
        parts.insert(0, f"/{_ANY}/")  # any text but that
    return " & ".join(parts)


def _searched(pattern: str) -> str:
    """A JSON Schema `pattern` (found anywhere in the value unless anchored) as an llguidance
    regex matching whole values."""
    start = pattern.startswith("^")
    end = pattern.endswith("$") and not pattern.endswith("\\$")
    core = pattern[1 if start else 0 : len(pattern) - 1 if end else len(pattern)]
    escaped, backslash = [], False
    for char in core:  # a slash would end the Lark regex: escape the bare ones
        escaped.append("\\/" if char == "/" and not backslash else char)
        backslash = char == "\\" and not backslash
    regex = "(?:" + "".join(escaped) + ")"
    return "/" + ("" if start else _ANY) + regex + ("" if end else _ANY) + "/"


def _strings(schema: dict[str, Any]) -> list[str]:
    """The only strings a text parameter may be (`const`, `enum`); empty: any text."""
    if isinstance(schema.get("const"), str):
        return [schema["const"]]
    values = schema.get("enum")
    if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
        return list(dict.fromkeys(values))
    return []


def _resolve(schema: dict[str, Any], ref: str) -> Any:
    """A `#/$defs/…` (or `#/definitions/…`) reference among the definitions kept with it."""
    parts = ref.split("/")
    if len(parts) != 3 or parts[0] != "#" or parts[1] not in ("$defs", "definitions"):
        return None
    table = schema.get(parts[1])
    return table.get(parts[2]) if isinstance(table, dict) else None


# -- reading ------------------------------------------------------------------------------


def _read_call(text: str, names: Sequence[str]) -> tuple[Any, str]:
    """(call, rest) of the text after an opening tag: the call is (name, arguments), complete
    when `rest` begins with the closing tag (or is empty after `</function>`); the arguments
    written so far when cut; None when cut before the name is known; _MALFORMED."""
    body = text.lstrip()
    if not body.startswith(FUNCTION):
        return (cut_name("", names), "") if FUNCTION.startswith(body) else (_MALFORMED, "")
    name, bracket, body = body[len(FUNCTION) :].partition(">")
    if not bracket:  # cut inside the name
        if "\n" in name or "<" in name:
            return _MALFORMED, ""
        return cut_name(name, names), ""
    values: dict[str, Any] = {}
    while True:
        body = body.lstrip()
        if body.startswith(PARAMETER):
            key, bracket, after = body[len(PARAMETER) :].partition(">")
            if not bracket:  # cut inside a parameter's name
                return (name, _so_far(values)), ""
            written, end, body = after.partition(PARAMETER_END)
            if not end:  # cut inside a value
                return (name, _so_far(values, key, written)), ""
            values[key] = _value(_trim(written))
        elif body.startswith(FUNCTION_END):
            rest = body[len(FUNCTION_END) :].lstrip()
            if not rest or (len(rest) < len(CLOSE) and CLOSE.startswith(rest)):
                return (name, compact(values)), ""  # complete, cut before its closing tag
            return (name, compact(values)), rest
        elif any(len(body) < len(m) and m.startswith(body) for m in (PARAMETER, FUNCTION_END)):
            return (name, _so_far(values)), ""  # cut inside a tag (or before one)
        else:
            return _MALFORMED, ""


def _trim(written: str) -> str:
    """A value less the newline after its opening tag and the one before its closing tag."""
    written = written[1:] if written.startswith("\n") else written
    return written[:-1] if written.endswith("\n") else written


def _value(written: str) -> Any:
    try:
        value = json.loads(written, parse_constant=_not_json)
    except ValueError:
        return written
    return written if isinstance(value, str) else value


def _not_json(constant: str) -> Any:
    raise ValueError(constant)  # NaN and Infinity: Python's, not JSON


def _so_far(values: dict[str, Any], key: str | None = None, written: str = "") -> str:
    """The arguments of a cut call as far as written: the compact object, open, with the value
    being written last as written when it begins like a number, array or object, as nothing
    yet while it may still become `true`, `false` or `null`, else as an open string. So each
    cut's arguments begin the next one's (but for text that begins like a number, array or
    object)."""
    text = compact(values)[:-1]
    if key is None:
        return text
    written = written[1:] if written.startswith("\n") else written
    written = _without_partial(written, "\n" + PARAMETER_END)
    if _literal_so_far(written):
        value = ""  # `true`, `false`, `null` or the text that begins like one: held back
    elif written[0] in "[{-0123456789":
        value = written  # JSON as written
    else:
        value = json.dumps(written, ensure_ascii=False)[:-1]
    return text + ("," if values else "") + json.dumps(key, ensure_ascii=False) + ":" + value


def _literal_so_far(written: str) -> bool:
    """Whether `written` (maybe empty) begins, or is, a JSON literal."""
    return any(literal.startswith(written) for literal in ("true", "false", "null"))
