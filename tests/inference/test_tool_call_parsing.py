"""Reading tool calls back (inference/structured.py) and the completion body built from them,
on outputs written as the grammar writes them, whole and cut by `max_tokens` at every point.

`hermes` is the one tool-call format implemented (structured.TOOL_CALL_FORMATS); a new format
gets its own cases here.
"""

from __future__ import annotations

import json

import pytest

from inference.chat_completions import completion_body, tool_calls
from inference.engine.types import (
    FINISH_LENGTH,
    FINISH_STOP,
    Choice,
    GenerationResult,
    SamplingParams,
)
from inference.structured import TOOL_CALL_FORMATS, parse_tool_calls

NAMES = ("get_weather", "get_time", "lookup")
WEATHER_ARGS = '{"city":"Paris ","unit":"c"}'  # a trailing blank inside a string, on purpose
LOOKUP_ARGS = '{"id":4}'
WEATHER_CALL = f'<tool_call>\n{{"name":"get_weather","arguments":{WEATHER_ARGS}}}\n</tool_call>'
LOOKUP_CALL = f'<tool_call>\n{{"name":"lookup","arguments":{LOOKUP_ARGS}}}\n</tool_call>'
TWO_CALLS = WEATHER_CALL + "\n" + LOOKUP_CALL


def test_hermes_is_the_only_format_these_cases_cover():
    assert TOOL_CALL_FORMATS == ("hermes",)


def calls_of(text: str, names: tuple[str, ...] = NAMES) -> list[tuple[str, str]] | None:
    calls = parse_tool_calls(text, seed="chatcmpl-1:0", names=names)
    if calls is None:
        return None
    return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


def test_complete_calls_come_back_whole_with_the_arguments_as_written():
    assert calls_of(TWO_CALLS) == [("get_weather", WEATHER_ARGS), ("lookup", LOOKUP_ARGS)]


def test_ids_are_distinct_and_derived_from_the_seed():
    first = parse_tool_calls(TWO_CALLS, seed="chatcmpl-1:0", names=NAMES) or []
    again = parse_tool_calls(TWO_CALLS, seed="chatcmpl-1:0", names=NAMES) or []
    other = parse_tool_calls(TWO_CALLS, seed="chatcmpl-2:0", names=NAMES) or []
    ids = [c["id"] for c in first]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)
    assert ids == [c["id"] for c in again]
    assert not set(ids) & {c["id"] for c in other}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # In the opening tag, or before the name: unknown among several names.
        ("<", []),
        ("<tool_call>\n", []),
        ('<tool_call>\n{"na', []),
        ('<tool_call>\n{"name":"', []),
        # In the name: known once one name alone begins with what was written.
        ('<tool_call>\n{"name":"get_', []),
        ('<tool_call>\n{"name":"get_w', [("get_weather", "")]),
        ('<tool_call>\n{"name":"lookup', [("lookup", "")]),
        # After the name: the arguments written so far, a string that is not JSON yet.
        ('<tool_call>\n{"name":"lookup"', [("lookup", "")]),
        ('<tool_call>\n{"name":"lookup","argu', [("lookup", "")]),
        ('<tool_call>\n{"name":"lookup","arguments":', [("lookup", "")]),
        ('<tool_call>\n{"name":"lookup","arguments":{', [("lookup", "{")]),
        (
            '<tool_call>\n{"name":"get_weather","arguments":{"city":"Par',
            [
                ("get_weather", '{"city":"Par'),
            ],
        ),
        (
            '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris ',
            [
                ("get_weather", '{"city":"Paris '),
            ],
        ),
        # The arguments whole, the call's JSON or its closing tag not.
        ('<tool_call>\n{"name":"lookup","arguments":{"id":4}', [("lookup", LOOKUP_ARGS)]),
        ('<tool_call>\n{"name":"lookup","arguments":{"id":4}}', [("lookup", LOOKUP_ARGS)]),
        (
            '<tool_call>\n{"name":"lookup","arguments":{"id":4}}\n</tool_c',
            [
                ("lookup", LOOKUP_ARGS),
            ],
        ),
    ],
)
def test_a_cut_call_comes_back_as_a_call_never_as_markup(text, expected):
    assert calls_of(text) == expected


def test_one_allowed_name_is_known_from_the_first_byte():
    # A named tool_choice (or a single tool): the grammar allows that function alone.
    assert calls_of("<", names=("lookup",)) == [("lookup", "")]
    assert calls_of('<tool_call>\n{"name":"lo', names=("lookup",)) == [("lookup", "")]


def test_complete_calls_before_the_cut_are_kept():
    first = WEATHER_CALL
    assert calls_of(first + "\n") == [("get_weather", WEATHER_ARGS)]
    assert calls_of(first + "\n<tool_") == [("get_weather", WEATHER_ARGS)]
    assert calls_of(first + '\n<tool_call>\n{"name":"look') == [
        ("get_weather", WEATHER_ARGS),
        ("lookup", ""),
    ]
    assert calls_of(first + '\n<tool_call>\n{"name":"lookup","arguments":{"i') == [
        ("get_weather", WEATHER_ARGS),
        ("lookup", '{"i'),
    ]


def test_every_cut_of_two_calls_is_calls_whose_arguments_prefix_the_whole_ones():
    whole = [("get_weather", WEATHER_ARGS), ("lookup", LOOKUP_ARGS)]
    for end in range(1, len(TWO_CALLS) + 1):
        calls = calls_of(TWO_CALLS[:end])
        assert calls is not None, end
        assert len(calls) <= 2, end
        for (name, arguments), (whole_name, whole_arguments) in zip(calls, whole, strict=False):
            assert name == whole_name and whole_arguments.startswith(arguments), end
        assert calls[:-1] == whole[: max(len(calls) - 1, 0)], end  # only the last may be cut


@pytest.mark.parametrize(
    "text",
    ["", "Hello there", '{"answer":1}', "  plain text < with a bracket", "[1,2]"],
)
def test_output_that_is_not_tool_calls_is_none(text):
    assert calls_of(text) is None


@pytest.mark.parametrize(
    "text",
    [
        "<b>bold</b>",
        '<tool_call>\n{"name":"lookup","arguments":{"id":4}}\n</tool_call> and text',
        '<tool_call>\n{"name":"lookup","arguments":{"id":4}}\nnot a tag',
        '<tool_call>\n["not", "a", "call"]\n</tool_call>',
        "<tool_call>\n[",
    ],
)
def test_output_the_grammar_could_not_have_written_is_not_read_as_calls(text):
    assert calls_of(text) is None


# -- the completion body ----------------------------------------------------------------------

LOOKUP = {"type": "function", "function": {"name": "lookup"}}
WEATHER = {"type": "function", "function": {"name": "get_weather"}}


def choice_of(body: dict, text: str, finish_reason: str) -> dict:
    result = GenerationResult(
        id="r",
        choices=[Choice(index=0, token_ids=[1], text=text, finish_reason=finish_reason)],
        prompt_tokens=3,
        completion_tokens=1,
        cached_tokens=0,
        busy_seconds=0.0,
        params=SamplingParams(max_new_tokens=1, tool_calls=tool_calls(body)),
    )
    completion = completion_body(
        result, completion_id="chatcmpl-1", model="m", model_config_id="c", created=1
    )
    return completion["choices"][0]


NAMED = {
    "tools": [WEATHER, LOOKUP],
    "tool_choice": {"type": "function", "function": {"name": "lookup"}},
}
REQUIRED = {"tools": [WEATHER, LOOKUP], "tool_choice": "required"}


def test_a_cut_named_call_is_a_call_with_partial_arguments_and_length():
    choice = choice_of(NAMED, '<tool_call>\n{"name":"lookup","arguments":{"i', FINISH_LENGTH)

    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "lookup", "arguments": '{"i'}
    with pytest.raises(ValueError):
        json.loads(call["function"]["arguments"])


def test_a_reply_cut_before_any_name_holds_no_markup_and_no_call():
    choice = choice_of(REQUIRED, '<tool_call>\n{"name":"', FINISH_LENGTH)

    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None
    assert "tool_calls" not in choice["message"]


def test_finish_reason_of_complete_calls_follows_the_reference():
    named = choice_of(NAMED, LOOKUP_CALL, FINISH_STOP)
    required = choice_of(REQUIRED, TWO_CALLS, FINISH_STOP)
    auto = choice_of({"tools": [LOOKUP, WEATHER]}, WEATHER_CALL, FINISH_STOP)

    assert named["finish_reason"] == "stop"  # tool_choice names the function
    assert [c["function"]["name"] for c in named["message"]["tool_calls"]] == ["lookup"]
    assert required["finish_reason"] == "tool_calls"
    assert len(required["message"]["tool_calls"]) == 2
    assert auto["finish_reason"] == "tool_calls"


def test_text_replies_and_tool_choice_none_are_left_as_text():
    auto_text = choice_of({"tools": [LOOKUP]}, "Just words.", FINISH_STOP)
    none = choice_of({"tools": [LOOKUP], "tool_choice": "none"}, "<b>hi</b>", FINISH_STOP)

    assert auto_text["message"]["content"] == "Just words." and auto_text["finish_reason"] == "stop"
    assert none["message"]["content"] == "<b>hi</b>" and "tool_calls" not in none["message"]
