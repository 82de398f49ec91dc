"""Whether an external engine's answer keeps what its row asked: the JSON of `response_format`
and the calls of `tools` (docs/API.md "Item error codes", `invalid_model_output`).

Boardwalk's own engine holds such a row to a grammar token by token, so its answers always
parse and validate; a server that does not (vLLM or SGLang started without structured outputs,
a model that ignores the request) may answer anything. `answer_violation(body, answer)` reads
the server's answer against the row's body and names the first rule it breaks, or None:

- `response_format` `json_schema` (the schema as enforced: `strict` applied) and `json_object`
  (a JSON object): each choice's `content` parses as JSON and validates;
- `tools`: each call of `tool_calls` names one of the row's functions (the named one under a
  named `tool_choice`), its `arguments` parse as JSON and validate against that function's
  `parameters`; `tool_choice` `required` or named means at least one call, `none` or no
  tools means none;
- a choice cut by `max_tokens` (`finish_reason: "length"`) is not checked: it may be
  incomplete, as with OpenAI and Boardwalk's own engine.

The reason never quotes the answer (it is the model's output): it says which rule failed, a
call by its position, the position in the JSON as the schema names it (`$.city`,
`$.items[]`), and the function and property names the row's own schema gives, where they look
like identifiers. JSON Schema `format`s are annotations here, not checked.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from inference.structured import GrammarError, function_schema, response_schema, tool_choice_mode

__all__ = ["answer_violation"]

logger = logging.getLogger(__name__)

# A name from the row's schema (a function, a property) is shown only when it looks like an
# identifier; anything else is shown as `*`.
_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$-]{0,63}")
_FINISH_CUT = "length"


def answer_violation(body: Mapping[str, Any], answer: Mapping[str, Any]) -> str | None:
    """The first rule of the row's `body` that the server's `answer` breaks, or None.
    Choices are named by position only when the answer has several."""
    try:
        schema = response_schema(body.get("response_format"))
    except GrammarError:  # refused at upload; a row that came another way is not checked
        schema = None
    tools = [t for t in body.get("tools") or () if isinstance(t, dict)]
    choices = answer.get("choices")
    choices = choices if isinstance(choices, list) else []
    for position, choice in enumerate(choices):
        choice = choice if isinstance(choice, dict) else {}
        if choice.get("finish_reason") == _FINISH_CUT:
            continue
        message = choice.get("message")
        message = message if isinstance(message, dict) else {}
        reason = _message_violation(body, message, schema, tools)
        if reason is not None:
            return f"choice {position}: {reason}" if len(choices) > 1 else reason
    return None


def _message_violation(
    body: Mapping[str, Any],
    message: Mapping[str, Any],
    schema: Any | None,
    tools: list[dict[str, Any]],
) -> str | None:
    calls = message.get("tool_calls")
    calls = calls if isinstance(calls, list) else []
    mode, named = tool_choice_mode(body) if tools else ("none", None)
    if calls:
        if mode == "none":
            return "the answer has tool calls, and the request allows none"
        return _calls_violation(calls, tools, named)
    if mode in ("required", "function"):
        return f"the request requires a tool call (tool_choice {mode}), and the answer has none"
    if schema is None:
        return None
    content = message.get("content")
    if not isinstance(content, str):
        return "the answer has no content, and response_format asks for JSON"
    if (value := _parsed(content)) is _INVALID:
        return "the answer is not valid JSON"
    where = _mismatch(value, schema)
    return None if where is None else f"the answer does not match the schema at {where}"


def _calls_violation(
    calls: list[Any], tools: list[dict[str, Any]], named: str | None
) -> str | None:
    functions = {
        tool["function"]["name"]: tool
        for tool in tools
        if isinstance(tool.get("function"), dict) and isinstance(tool["function"].get("name"), str)
    }
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        function = function if isinstance(function, dict) else {}
        name = function.get("name")
        if not isinstance(name, str) or name not in functions:
            return f"tool call {index} names no function of the request's tools"
        if named is not None and name != named:
            return f"tool call {index} names another function than tool_choice does"
        arguments = function.get("arguments")
        if not isinstance(arguments, str) or (value := _parsed(arguments)) is _INVALID:
            return f"the arguments of tool call {index} are not valid JSON"
        where = _mismatch(value, function_schema(functions[name]))
        if where is not None:
            return (
                f"the arguments of tool call {index} do not match the schema of "
                f"{_shown(name)} at {where}"
            )
    return None


_INVALID = object()


def _parsed(text: str) -> Any:
    """The JSON value of `text`, or _INVALID (NaN and Infinity are not JSON)."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError:
        return _INVALID


def _mismatch(value: Any, schema: Any) -> str | None:
    """Where and how `value` breaks `schema` (`$.city: required property city missing`), or
    None when it validates."""
    try:
        error = _first_error(_validator(_schema_key(schema)), value)
    except (jsonschema.exceptions.SchemaError, RecursionError, LookupError):
        # The schema compiled for Boardwalk's own grammar at upload; a part this validator
        # cannot read is no reason to fail the row.
        logger.warning("a structured-output schema could not be checked; the answer passes")
        return None
    return None if error is None else f"{_path(error)}: {_rule(error)}"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _schema_key(schema: Any) -> str:
    return json.dumps(schema, sort_keys=True, ensure_ascii=False)


@functools.lru_cache(maxsize=256)
def _validator(key: str) -> Validator:
    """The schema's validator, once per schema (a file's rows usually share one); the draft
    its `$schema` names, 2020-12 by default."""
    schema = json.loads(key)
    cls = jsonschema.validators.validator_for(schema, default=Draft202012Validator)
    return cls(schema)  # type: ignore[no-any-return]


def _first_error(validator: Validator, value: Any) -> ValidationError | None:
    """The most relevant error (jsonschema's own choice among branches), or None."""
    return jsonschema.exceptions.best_match(validator.iter_errors(value))


def _path(error: ValidationError) -> str:
    """Where in the JSON, written from the schema's path (never from the answer's keys):
    `$.name` for a property, `[]` for an item, `.*` for a property the schema does not name."""
    path = "$"
    steps = list(error.absolute_schema_path)[:-1]  # the last step is the failing keyword
    at = 0
    while at < len(steps):
        step = steps[at]
        following = steps[at + 1] if at + 1 < len(steps) else None
        if step in ("properties", "patternProperties") and following is not None:
            path += f".{_shown(following) if step == 'properties' else '*'}"
            at += 2
            continue
        if step == "additionalProperties":
            path += ".*"
        elif step == "items":
            path += "[]"
        elif step == "prefixItems" and following is not None:
            path += f"[{following}]"
            at += 2
            continue
        at += 1
    return path


def _rule(error: ValidationError) -> str:
    """The JSON Schema keyword that failed; for `required`, the first property missing as
    the schema names it."""
    keyword = str(error.validator)
    if keyword == "required" and isinstance(error.instance, dict):
        missing = _first_missing(error.validator_value, error.instance)
        if missing is not None:
            return f"required property {_shown(missing)} missing"
    if keyword == "additionalProperties":
        return "a property the schema does not allow"
    return keyword if _NAME.fullmatch(keyword) else "a keyword"


def _first_missing(required: Iterable[Any], instance: Mapping[str, Any]) -> str | None:
    for name in required if isinstance(required, list) else ():
        if isinstance(name, str) and name not in instance:
            return name
    return None


def _shown(name: Any) -> str:
    return name if isinstance(name, str) and _NAME.fullmatch(name) else "*"
