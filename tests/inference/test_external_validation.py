"""An external engine's answer is held to what its row asked (issue 41, "response_format and
tools are passed through"): a `json_schema` answer, a `json_object` answer and tool calls that
do not parse or validate end the row as `invalid_model_output`, never as a silent invalid
success; the log says which rule failed, never the answer. Retries exhausted against an
upstream that stays overloaded or out of reach end the row as `upstream_unavailable`.

The answers come over HTTP: from the real `transformers serve` on the tiny demo model (which
ignores `response_format` and `tool_choice`, as a server without structured outputs does), or
canned by the fault-injecting proxy as a server's 200 (tests/inference/upstreams.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import pytest

from boardwalk.codes import ItemCode
from inference.engine.types import GenerationRequest, SamplingParams
from inference.external.client import Retryable
from inference.external.engine import exhausted_code
from inference.external.validation import answer_violation
from tests.inference import test_external_engine as external
from tests.inference.test_external_engine import body, results_of
from tests.inference.upstreams import FaultProxy, cut, status

# The external-engine tests' fixtures: the served tiny model, its proxy and engines.
served = external.served
tokenizer = external.tokenizer
proxy = external.proxy
engine_of = external.engine_of

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1},
        "hours": {"type": "array", "items": {"type": "integer"}},
    },
    "required": ["city"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER}}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
# Text a model might write that must never reach a log line or an error.
SECRET = "Zanzibar-7731"


def answer(*contents: str | None, finish: str = "stop", calls: Any = None) -> dict[str, Any]:
    """A server's chat completion: one choice per content."""
    return {
        "id": "chatcmpl-upstream",
        "object": "chat.completion",
        "created": 1,
        "model": "upstream-model",
        "choices": [
            {
                "index": index,
                "message": {"role": "assistant", "content": content}
                | ({"tool_calls": calls} if calls is not None else {}),
                "finish_reason": finish,
            }
            for index, content in enumerate(contents)
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


def call(name: str, arguments: Any) -> list[dict[str, Any]]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return [{"id": "call_1", "type": "function", "function": {"name": name, "arguments": text}}]


def asking(seed: int, **fields: Any) -> GenerationRequest:
    return GenerationRequest(
        id=f"row-{seed}",
        prompt_ids=[1, 2, 3, 4],
        params=SamplingParams(max_new_tokens=3, temperature=0.0),
        body=body(seed, **fields),
    )


def run_canned(proxy, engine_of, request: GenerationRequest, canned: dict[str, Any]):
    """The row's result when the server answers `canned` (a real 200 over HTTP)."""
    sent = len(proxy.posts())
    proxy.plan(status(200, body=canned))
    engine = engine_of(proxy)
    engine.add(request)
    [result] = results_of(engine, 1).values()
    # Sent once: an answer that breaks its rules is not retried.
    assert len(proxy.posts()) == sent + 1
    return result


def assert_invalid(result, caplog, rule: str) -> None:
    """The row ended as invalid_model_output, counted as a failed row, and the log names the
    rule it broke and none of the answer's text."""
    assert result.error == ItemCode.INVALID_MODEL_OUTPUT and not result.aborted
    assert result.choices == [] and result.response is None  # nothing to publish
    assert result.completion_tokens == 0 and result.prompt_tokens == 4
    assert result.busy_seconds > 0  # the server's time is metered (a deployment pays it)
    lines = [r.getMessage() for r in caplog.records]
    assert any(rule in line and "invalid_model_output" in line for line in lines), lines
    assert not any(SECRET in line for line in lines)


# -- canned answers over HTTP ---------------------------------------------------------------


def test_a_json_schema_answer_that_validates_is_a_success(proxy, engine_of):
    content = json.dumps({"city": SECRET, "days": 2, "hours": [9, 17]})
    result = run_canned(proxy, engine_of, asking(1, response_format=JSON_SCHEMA), answer(content))
    assert result.error is None and result.choices[0].text == content
    assert (result.prompt_tokens, result.completion_tokens) == (11, 7)
    # The schema went to the server as asked.
    assert proxy.posts()[0]["json"]["response_format"] == JSON_SCHEMA


def test_an_answer_that_is_not_json_ends_the_row(proxy, engine_of, caplog):
    caplog.set_level(logging.WARNING)
    result = run_canned(
        proxy, engine_of, asking(1, response_format=JSON_SCHEMA), answer(f'{{"city": "{SECRET}')
    )
    assert_invalid(result, caplog, "the answer is not valid JSON")


def test_json_that_breaks_the_schema_ends_the_row(proxy, engine_of, caplog):
    caplog.set_level(logging.WARNING)
    content = json.dumps({"city": SECRET, "days": 0})
    result = run_canned(proxy, engine_of, asking(1, response_format=JSON_SCHEMA), answer(content))
    assert_invalid(result, caplog, "the answer does not match the schema at $.days: minimum")


def test_json_object_asks_for_an_object(proxy, engine_of, caplog):
    caplog.set_level(logging.WARNING)
    request = asking(1, response_format={"type": "json_object"})
    result = run_canned(proxy, engine_of, request, answer(json.dumps([SECRET])))
    assert_invalid(result, caplog, "the answer does not match the schema at $: type")


def test_an_unknown_tool_ends_the_row(proxy, engine_of, caplog):
    caplog.set_level(logging.WARNING)
    canned = answer(None, finish="tool_calls", calls=call(SECRET, {"city": "Paris"}))
    result = run_canned(proxy, engine_of, asking(1, tools=TOOLS), canned)
    assert_invalid(result, caplog, "tool call 0 names no function of the request's tools")


def test_tool_arguments_that_break_the_parameters_end_the_row(proxy, engine_of, caplog):
    caplog.set_level(logging.WARNING)
    canned = answer(None, finish="tool_calls", calls=call("get_weather", {"days": 2}))
    result = run_canned(proxy, engine_of, asking(1, tools=TOOLS), canned)
    assert_invalid(
        result,
        caplog,
        "the arguments of tool call 0 do not match the schema of get_weather at $: "
        "required property city missing",
    )


def test_tool_arguments_that_are_not_json_end_the_row(proxy, engine_of, caplog):
    caplog.set_level(logging.WARNING)
    canned = answer(None, finish="tool_calls", calls=call("get_weather", f"{{city: {SECRET}"))
    result = run_canned(proxy, engine_of, asking(1, tools=TOOLS), canned)
    assert_invalid(result, caplog, "the arguments of tool call 0 are not valid JSON")


def test_valid_tool_calls_are_a_success(proxy, engine_of):
    canned = answer(None, finish="tool_calls", calls=call("get_weather", {"city": SECRET}))
    result = run_canned(proxy, engine_of, asking(1, tools=TOOLS), canned)
    assert result.error is None
    [relayed] = result.response["choices"][0]["message"]["tool_calls"]
    assert relayed["function"]["name"] == "get_weather"


def test_every_choice_is_checked_and_a_cut_one_is_not(proxy, engine_of, caplog):
    caplog.set_level(logging.WARNING)
    good = json.dumps({"city": SECRET})
    request = asking(1, response_format=JSON_SCHEMA, n=2)
    result = run_canned(proxy, engine_of, request, answer(good, json.dumps({"days": 3})))
    assert_invalid(result, caplog, "choice 1: the answer does not match the schema at $: ")
    # Cut by max_tokens, incomplete JSON is what the row asked for (as with OpenAI).
    cut_short = run_canned(
        proxy, engine_of, asking(2, response_format=JSON_SCHEMA), answer('{"ci', finish="length")
    )
    assert cut_short.error is None and cut_short.choices[0].finish_reason == "length"


# -- the real server, which does not enforce them -------------------------------------------


def test_a_server_without_structured_outputs_cannot_pass_off_free_text(served, engine_of, caplog):
    """`transformers serve` ignores `response_format` and `tool_choice`, as a server without
    structured outputs does: the tiny model's text is no JSON of the schema and no tool call,
    so both rows end in error. (Its few tokens are cut by `max_tokens`; the proxy has them
    read as a model that stopped by itself, which is when an answer is held to its rules.)"""
    caplog.set_level(logging.WARNING)
    with FaultProxy(served.url.removesuffix("/v1"), finish_reason="stop") as stopped:
        engine = engine_of(stopped)
        engine.add(asking(1, response_format=JSON_SCHEMA))
        engine.add(asking(2, tools=TOOLS, tool_choice="required"))
        results = results_of(engine, 2)
        assert [s["answer"] for s in stopped.posts()] == ["forward", "forward"]
    for result in results.values():
        assert result.error == ItemCode.INVALID_MODEL_OUTPUT and result.choices == []
    lines = "\n".join(r.getMessage() for r in caplog.records)
    assert "row-1: the answer " in lines
    assert "row-2: the request requires a tool call (tool_choice required)" in lines


# -- retries exhausted ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("faults", "code"),
    [
        ([status(503, retry_after="0")] * 3, ItemCode.UPSTREAM_UNAVAILABLE),
        ([status(429, retry_after="0"), status(502), cut()], ItemCode.UPSTREAM_UNAVAILABLE),
        ([status(500)] * 3, ItemCode.INTERNAL_ERROR),
    ],
    ids=["503", "429-502-unreachable", "500"],
)
def test_retries_exhausted_say_whether_the_upstream_was_down(proxy, engine_of, faults, code):
    proxy.plan(*faults)
    engine = engine_of(proxy, max_attempts=3)
    # Interactive: every retry is an attempt (a batch row waits out 429s and 503s).
    engine.add(dataclasses.replace(asking(1), priority=1))
    [result] = results_of(engine, 1).values()
    assert result.error == code and result.choices == [] and result.completion_tokens == 0
    assert len(proxy.posts()) == 3


# -- the rules, without a server ----------------------------------------------------------------


def test_the_rules_read_from_the_schema_never_from_the_answer():
    schema = {"response_format": JSON_SCHEMA}
    extra = json.dumps({"city": "x", SECRET: 1})
    assert answer_violation(schema, answer(extra)) == (
        "the answer does not match the schema at $: a property the schema does not allow"
    )
    nested = json.dumps({"city": "x", "hours": [1, SECRET]})
    assert answer_violation(schema, answer(nested)) == (
        "the answer does not match the schema at $.hours[]: type"
    )
    assert answer_violation(schema, answer("NaN")) == "the answer is not valid JSON"
    assert answer_violation(schema, answer(None)) == (
        "the answer has no content, and response_format asks for JSON"
    )
    strict = {"type": "json_schema", "json_schema": {"name": "s", "strict": True, "schema": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}}  # fmt: skip
    assert answer_violation({"response_format": strict}, answer("{}")) == (
        "the answer does not match the schema at $: required property a missing"
    )
    named = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    assert answer_violation(named, answer(None, calls=call("get_weather", {"city": "x"}))) == (
        "tool call 0 names another function than tool_choice does"
    )
    refused = {"tools": TOOLS, "tool_choice": "none"}
    assert answer_violation(refused, answer(None, calls=call("get_time", {}))) == (
        "the answer has tool calls, and the request allows none"
    )
    assert answer_violation({"tools": TOOLS}, answer("free text is allowed under auto")) is None
    assert answer_violation({}, answer("no rules asked")) is None


def test_exhausted_codes():
    assert exhausted_code(Retryable("connection")) == ItemCode.UPSTREAM_UNAVAILABLE
    assert exhausted_code(Retryable("timeout")) == ItemCode.UPSTREAM_UNAVAILABLE
    assert exhausted_code(Retryable("server_error", 502)) == ItemCode.UPSTREAM_UNAVAILABLE
    assert exhausted_code(Retryable("server_error", 500)) == ItemCode.INTERNAL_ERROR
    assert exhausted_code(Retryable("invalid_response", 200)) == ItemCode.INTERNAL_ERROR
