"""The harmony dialect (GPT-OSS) on GPT-OSS's real tokenizer and its real chat template.

Replies are written as the model writes them (after the prompt's `<|start|>assistant`), some
copied from how the template renders an earlier assistant turn, tokenized by the real tokenizer
and decoded as the engine decodes them (markup kept, the turn's end token left out).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llguidance
import llguidance.hf
import pytest

from inference.dialects import DIALECTS, check_grammar, detect
from inference.dialects.harmony import HARMONY
from inference.engine.decoding import TextDecoder
from inference.structured import validate
from tests.dialects.conftest import as_generated, marks_for
from tests.formats.families import template_path

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city."},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOLS = [WEATHER, TIME]
NAMES = ("get_weather", "get_time")
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "sum", "schema": SCHEMA}}

# The bug of the issue: read back as one block of text with the channels' names in it.
ISSUE_REPLY = (
    "<|channel|>analysis<|message|>User asks simple math. Answer 4.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>2+2 equals 4."
)
# A call as GPT-OSS writes it: the recipient in the channel part of the header.
CALL_REPLY = (
    "<|channel|>analysis<|message|>Need the weather in Paris.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city":"Paris","unit":"celsius"}'
)
PREAMBLE_REPLY = (
    "<|channel|>analysis<|message|>Two steps: weather first.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>I will look up the weather first.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city":"Paris"}'
)


@pytest.fixture
def tok(family_tokenizer: Callable[[str], Any]) -> Any:
    return family_tokenizer("gpt-oss")


def render(tok: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """The conversation as the engine renders it: the dialect's field names, `kwargs` as
    template variables (tools, reasoning_effort)."""
    kwargs.setdefault("add_generation_prompt", True)
    text = tok.apply_chat_template(HARMONY.template_messages(messages), tokenize=False, **kwargs)
    assert isinstance(text, str)
    return text


def generated(tok: Any, reply: str) -> str:
    return as_generated(tok, HARMONY, reply)


def prefixes(tok: Any, reply: str) -> list[str]:
    """The reply's text after each of its tokens, as a reply cut by max_tokens there."""
    ids = tok.encode(reply, add_special_tokens=False)
    decoder = TextDecoder(tok, HARMONY.markup)
    return [decoder.decode(ids[:k]) for k in range(len(ids) + 1)]


def template_reply(tok: Any, assistant: dict[str, Any], *, tools: list[Any] | None = None) -> str:
    """The reply an assistant turn stands for, copied from how the template renders it as the
    last turn of a conversation (training form): what follows the prompt's
    `<|start|>assistant`, less the token that ends the turn."""
    user = [{"role": "user", "content": "What is the weather in Paris?"}]
    prompt = render(tok, user, tools=tools)
    whole = render(tok, [*user, assistant], tools=tools, add_generation_prompt=False)
    assert whole.startswith(prompt)
    reply = whole[len(prompt) :]
    for end in HARMONY.turn_ends:
        reply = reply.removesuffix(end)
    return reply


@functools.cache
def _lltokenizer(tok: Any) -> Any:
    # Built once: reading GPT-OSS's 200k-token vocabulary takes seconds.
    return llguidance.hf.from_tokenizer(tok, n_vocab=len(tok))


def grammar_accepts(tok: Any, grammar: str, reply: str, *, complete: bool = True) -> bool:
    """tests/dialects/conftest.py's `grammar_accepts`, with llguidance's tokenizer built once."""
    matcher = llguidance.LLMatcher(_lltokenizer(tok), grammar, log_level=0)
    for token in tok.encode(reply, add_special_tokens=False):
        if not matcher.consume_token(token):
            return False
    return matcher.is_accepting() if complete else not matcher.is_error()


# -- the vocabulary and the registry ------------------------------------------------------


def test_markup_and_turn_ends_are_special_tokens_of_the_vocabulary(tok: Any) -> None:
    vocab = tok.get_vocab()
    special = {str(t) for t in tok.added_tokens_decoder.values() if t.special}
    for marker in (*HARMONY.markup, *HARMONY.turn_ends):
        assert marker in vocab and marker in special, marker
    # The release's end-of-turn ids include both turn ends (tests/formats/families.py).
    assert {vocab["<|return|>"], vocab["<|call|>"]} <= {200002, 199999, 200012}
    assert set(HARMONY.markers) == set(HARMONY.markup)
    assert marks_for(tok, HARMONY).single_tokens == frozenset(HARMONY.markup)
    assert DIALECTS["harmony"] is HARMONY
    assert HARMONY.tools is not None and HARMONY.tools.name == "harmony"
    assert not HARMONY.opened("<|start|>assistant")
    assert not HARMONY.opened("<|start|>assistant<|channel|>analysis<|message|>")


def test_detect_picks_harmony_for_the_gpt_oss_template_only(tok: Any) -> None:
    assert detect(tok.chat_template) is HARMONY
    folder: Path = template_path("openai-gpt-oss-120b.jinja").parent
    others = [p for p in sorted(folder.glob("*.jinja")) if p.name != "openai-gpt-oss-120b.jinja"]
    assert len(others) > 10
    for path in others:
        assert detect(path.read_text(encoding="utf-8")) is not HARMONY, path.name


def test_detect_does_not_pick_harmony_for_gemma3(family_tokenizer: Callable[[str], Any]) -> None:
    # Gemma 3's template is in its tokenizer config, not among llama.cpp's files.
    assert detect(family_tokenizer("gemma3").chat_template) is not HARMONY


# -- prompts ------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["system", "developer"])
def test_system_and_developer_messages_become_the_developer_message(tok: Any, role: str) -> None:
    text = render(tok, [{"role": role, "content": "Be brief."}, {"role": "user", "content": "hi"}])
    # The template writes harmony's own system message (identity, date, effort) itself; the
    # request's system or developer message is harmony's developer message (instructions).
    assert text.startswith("<|start|>system<|message|>You are ChatGPT")
    assert "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>" in text
    assert text.endswith("<|start|>user<|message|>hi<|end|><|start|>assistant")


def test_tools_are_declared_in_the_developer_message(tok: Any) -> None:
    text = render(tok, [{"role": "user", "content": "hi"}], tools=TOOLS)
    assert "Calls to these tools must go to the commentary channel: 'functions'." in text
    assert "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {" in text
    assert "type get_weather = (_: {\n// The city.\ncity: string,\n" in text
    assert 'unit?: "celsius" | "fahrenheit",' in text


@pytest.mark.parametrize("effort", ["low", "medium", "high"])
def test_reasoning_effort_reaches_the_template(tok: Any, effort: str) -> None:
    options = HARMONY.template_options({"reasoning_effort": effort})
    assert options == {"reasoning_effort": effort}
    text = render(tok, [{"role": "user", "content": "hi"}], **options)
    assert f"\nReasoning: {effort}\n" in text


def test_reasoning_effort_defaults_and_choices(tok: Any) -> None:
    assert HARMONY.template_options({}) == {}
    assert "\nReasoning: medium\n" in render(tok, [{"role": "user", "content": "hi"}])
    assert list(HARMONY.efforts) == ["low", "medium", "high"]


def test_an_earlier_call_with_its_reasoning_and_the_tool_result(tok: Any) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",  # how inference/rendering.py passes a call's null content
            "reasoning_content": "Need the weather in Paris.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    # Arguments as an object: the transformers convention (rendering.py).
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    ]
    text = render(tok, messages, tools=TOOLS)
    # The reasoning before a call goes back as its analysis message, the call with the
    # recipient in the role part of the header, the result from the function to the assistant.
    assert text.endswith(
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Need the weather in Paris.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
        '<|message|>{"city": "Paris"}<|call|>'
        "<|start|>functions.get_weather to=assistant<|channel|>commentary"
        '<|message|>"{\\"temp\\": 21}"<|end|>'
        "<|start|>assistant"
    )


def test_reasoning_of_an_answered_turn_is_dropped(tok: Any) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4.", "reasoning_content": "Simple math."},
        {"role": "user", "content": "3+3?"},
    ]
    text = render(tok, messages)
    # Harmony drops the chain of thought of turns that ended in a final answer.
    assert "Simple math." not in text
    assert "<|start|>assistant<|channel|>final<|message|>4.<|end|>" in text


def test_reasoning_of_the_last_assistant_turn_renders_in_training_form(tok: Any) -> None:
    assistant = {"role": "assistant", "content": "4.", "reasoning_content": "Simple math."}
    text = render(
        tok, [{"role": "user", "content": "2+2?"}, assistant], add_generation_prompt=False
    )
    assert text.endswith(
        "<|start|>assistant<|channel|>analysis<|message|>Simple math.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>4.<|return|>"
    )


def test_messages_the_raw_template_refuses_are_made_renderable(tok: Any) -> None:
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "P"}}}
    both: dict[str, Any] = {
        "role": "assistant",
        "content": "Looking it up.",
        "reasoning_content": "Need it.",
        "tool_calls": [call],
    }
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        both,
        {"role": "tool", "content": "sun"},
    ]
    # A reply read back with a preamble holds content, reasoning and a call; the template
    # refuses content and thinking together on a call message: the reasoning is kept.
    raw = [{**m, "thinking": m["reasoning_content"]} if m is both else m for m in messages]
    with pytest.raises(Exception, match="Cannot pass both content and thinking"):
        tok.apply_chat_template(raw, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    text = render(tok, messages, tools=TOOLS)
    assert "<|channel|>analysis<|message|>Need it.<|end|>" in text
    assert "Looking it up." not in text
    # A null reasoning_content is left out, not handed to the template as None.
    nulled: dict[str, Any] = {"role": "assistant", "content": "ok", "reasoning_content": None}
    assert "ok<|end|>" in render(tok, [{"role": "user", "content": "hi"}, nulled, messages[0]])


def test_an_earlier_turn_with_two_calls_renders_only_the_first(tok: Any) -> None:
    calls = [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "A"}}},
        {"type": "function", "function": {"name": "get_time", "arguments": {"city": "B"}}},
    ]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "sun"},
        {"role": "tool", "content": "noon"},
    ]
    text = render(tok, messages, tools=TOOLS)
    # Harmony makes one call per turn: the template keeps the first call and names every
    # result after it (a limit of the format, which the grammar keeps to).
    assert 'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "A"}' in text
    assert "to=functions.get_time" not in text
    assert text.count("<|start|>functions.get_weather to=assistant") == 2


# -- reading replies back -----------------------------------------------------------------


def test_the_issue_reply_reads_back_as_reasoning_and_content(tok: Any) -> None:
    # Without the markup kept (the bug) the channels run into the text:
    ids = tok.encode(ISSUE_REPLY, add_special_tokens=False)
    assert TextDecoder(tok).decode(ids) == (
        "analysisUser asks simple math. Answer 4.assistantfinal2+2 equals 4."
    )
    text = generated(tok, ISSUE_REPLY)
    assert text == ISSUE_REPLY
    reply = HARMONY.read(text)
    assert reply.reasoning == "User asks simple math. Answer 4."
    assert reply.content == "2+2 equals 4."
    assert reply.calls is None
    # The reasoning tokens end with the analysis message's <|end|>.
    assert text[: reply.answer_at].endswith("Answer 4.<|end|>")
    assert HARMONY.read(text, names=NAMES) == reply


def test_an_answer_copied_from_the_template_reads_back(tok: Any) -> None:
    assistant = {
        "role": "assistant",
        "content": "It is sunny.\n\nEnjoy Paris!",
        "reasoning_content": "User wants weather; I know it.",
    }
    reply = HARMONY.read(generated(tok, template_reply(tok, assistant)), names=NAMES)
    assert (reply.reasoning, reply.content, reply.calls) == (
        "User wants weather; I know it.",
        "It is sunny.\n\nEnjoy Paris!",
        None,
    )


def test_an_answer_without_reasoning(tok: Any) -> None:
    reply = HARMONY.read(generated(tok, "<|channel|>final<|message|>Hello!"))
    assert (reply.reasoning, reply.content, reply.answer_at) == (None, "Hello!", 0)


def test_one_call_as_the_model_writes_it(tok: Any) -> None:
    reply = HARMONY.read(generated(tok, CALL_REPLY), names=NAMES)
    assert reply.reasoning == "Need the weather in Paris."
    assert reply.content is None
    assert reply.calls == [("get_weather", '{"city":"Paris","unit":"celsius"}')]


def test_one_call_copied_from_the_template(tok: Any) -> None:
    assistant = {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Need the weather in Paris.",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris", "n": "ü"}},
            }
        ],
    }
    reply_text = template_reply(tok, assistant, tools=TOOLS)
    # The template writes the recipient in the role part, and the content type without
    # <|constrain|>.
    assert reply_text.endswith(
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
        '<|message|>{"city": "Paris", "n": "ü"}'
    )
    reply = HARMONY.read(generated(tok, reply_text), names=NAMES)
    assert reply.reasoning == "Need the weather in Paris."
    assert reply.content is None
    # Complete arguments come back compact, non-ASCII as is.
    assert reply.calls == [("get_weather", '{"city":"Paris","n":"ü"}')]


def test_a_call_right_away_with_the_recipient_in_the_role(tok: Any) -> None:
    text = generated(
        tok, ' to=functions.get_time<|channel|>commentary json<|message|>{"city":"Oslo"}'
    )
    reply = HARMONY.read(text, names=NAMES)
    assert (reply.reasoning, reply.content, reply.answer_at) == (None, None, 0)
    assert reply.calls == [("get_time", '{"city":"Oslo"}')]


def test_a_call_on_the_analysis_channel_is_a_call(tok: Any) -> None:
    text = generated(
        tok,
        "<|channel|>analysis<|message|>Check.<|end|><|start|>assistant<|channel|>analysis"
        ' to=functions.get_time <|constrain|>json<|message|>{"city":"Rome"}',
    )
    reply = HARMONY.read(text, names=NAMES)
    assert (reply.reasoning, reply.calls) == ("Check.", [("get_time", '{"city":"Rome"}')])


def test_a_preamble_before_a_call_is_content(tok: Any) -> None:
    reply = HARMONY.read(generated(tok, PREAMBLE_REPLY), names=NAMES)
    assert reply.reasoning == "Two steps: weather first."
    assert reply.content == "I will look up the weather first."
    assert reply.calls == [("get_weather", '{"city":"Paris"}')]
    # The preamble's own markup is not reasoning.
    assert generated(tok, PREAMBLE_REPLY)[reply.answer_at :].startswith(
        "<|start|>assistant<|channel|>commentary<|message|>I will"
    )


def test_two_call_messages_read_as_two_calls(tok: Any) -> None:
    # <|call|> ends the turn, so GPT-OSS makes one call per turn (no parallel calls). Should
    # a reply hold two call messages (ended by <|end|>), both are read.
    text = generated(
        tok,
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"A"}'
        "<|end|><|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json"
        '<|message|>{"city":"B"}',
    )
    reply = HARMONY.read(text, names=NAMES)
    assert reply.calls == [("get_weather", '{"city":"A"}'), ("get_time", '{"city":"B"}')]
    assert HARMONY.tools is not None
    assert HARMONY.tools.read_calls(text, NAMES) == reply.calls
    assert HARMONY.tools.read_calls(generated(tok, ISSUE_REPLY), NAMES) is None


def test_a_call_without_tools_offered_is_not_read(tok: Any) -> None:
    reply = HARMONY.read(generated(tok, CALL_REPLY))
    assert (reply.reasoning, reply.content, reply.calls) == (
        "Need the weather in Paris.",
        None,
        None,
    )


def test_a_call_cut_by_max_tokens_keeps_its_arguments_so_far(tok: Any) -> None:
    full_arguments = '{"city":"Paris","unit":"celsius"}'
    seen_name = seen_arguments = False
    for text in prefixes(tok, CALL_REPLY):
        reply = HARMONY.read(text, names=NAMES)
        assert reply.content is None
        if "to=functions.get_" not in text:
            assert reply.calls is None  # the name is not known yet
            continue
        if text.endswith(("to=functions.get_", "to=functions.get")):
            assert reply.calls is None  # get_weather or get_time
            continue
        assert reply.calls is not None and len(reply.calls) == 1
        name, arguments = reply.calls[0]
        assert name == "get_weather"
        seen_name = True
        assert full_arguments.startswith(arguments), arguments
        seen_arguments = seen_arguments or 0 < len(arguments) < len(full_arguments)
        if "<|message|>{" in text and arguments:
            assert text.endswith(arguments)
    assert seen_name and seen_arguments
    # Cut inside a string argument: its blanks so far are kept.
    cut = CALL_REPLY.replace('"Paris","unit":"celsius"}', '"New ')
    assert HARMONY.read(generated(tok, cut), names=NAMES).calls == [
        ("get_weather", '{"city":"New ')
    ]


def test_a_cut_name_is_known_once_only_one_function_begins_so(tok: Any) -> None:
    head = "<|channel|>commentary to=functions."
    assert HARMONY.read(generated(tok, head + "get_w"), names=NAMES).calls == [("get_weather", "")]
    assert HARMONY.read(generated(tok, head + "get_"), names=NAMES).calls is None
    assert HARMONY.read(generated(tok, head), names=("get_time",)).calls == [("get_time", "")]
    done = head + "get_time <|constrain|>json"
    assert HARMONY.read(generated(tok, done), names=NAMES).calls == [("get_time", "")]


def test_reasoning_cut_by_max_tokens_has_no_content(tok: Any) -> None:
    texts = prefixes(tok, ISSUE_REPLY)
    inside = [t for t in texts if "<|end|>" not in t]
    for text in inside:
        reply = HARMONY.read(text)
        assert reply.content is None and reply.calls is None
        assert reply.answer_at == (len(text) if "<|message|>" in text else 0)
        assert "User asks simple math. Answer 4.".startswith(reply.reasoning or "")
    # After the analysis message, the answer's header still being written: no content yet.
    between = [t for t in texts if "<|end|>" in t and "final<|message|>" not in t]
    assert between
    for text in between:
        reply = HARMONY.read(text)
        assert (reply.reasoning, reply.content) == ("User asks simple math. Answer 4.", None)
        assert reply.answer_at == len(text)


def test_a_stop_string_inside_the_reasoning(tok: Any) -> None:
    # A stop string ("Answer") found inside the reasoning cuts the text there.
    text = generated(tok, ISSUE_REPLY)
    cut = text[: text.index("Answer")]
    reply = HARMONY.read(cut, names=NAMES)
    assert (reply.reasoning, reply.content, reply.calls) == ("User asks simple math.", None, None)


def test_an_answer_cut_by_max_tokens_keeps_its_text_so_far(tok: Any) -> None:
    text = generated(tok, ISSUE_REPLY)
    reply = HARMONY.read(text[: text.index("equals")])
    assert (reply.reasoning, reply.content) == ("User asks simple math. Answer 4.", "2+2")


@pytest.mark.parametrize("reply_text", [ISSUE_REPLY, CALL_REPLY, PREAMBLE_REPLY])
def test_stream_views_extend_each_other_and_end_as_read(tok: Any, reply_text: str) -> None:
    shown = ("", "")
    for text in prefixes(tok, reply_text):
        view = HARMONY.stream_view(text)
        assert view[0].startswith(shown[0]) and view[1].startswith(shown[1]), (text, view)
        assert not re.search(r"<\|[a-z]+\|>", view[0] + view[1]), view  # no markup shown
        shown = view
    reply = HARMONY.read(generated(tok, reply_text), names=NAMES)
    assert shown == (reply.reasoning or "", reply.content or "")


# -- grammars -----------------------------------------------------------------------------


def grammar_of(tok: Any, body: dict[str, Any]) -> str:
    grammar = HARMONY.grammar(body, marks=marks_for(tok, HARMONY))
    assert grammar is not None
    validate(grammar)
    check_grammar(body, HARMONY)  # the upload check, without the vocabulary
    return grammar


ROLE_CALL = (
    "<|channel|>analysis<|message|>Need it.<|end|>"
    '<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"city":"Oslo"}'
)
BAD_ARGUMENTS = CALL_REPLY.replace('"unit":"celsius"', '"unit":"kelvin"')
UNKNOWN_FUNCTION = CALL_REPLY.replace("functions.get_weather", "functions.get_rain")


def test_no_grammar_for_free_text(tok: Any) -> None:
    assert HARMONY.grammar({"messages": []}) is None
    assert HARMONY.grammar({"tools": TOOLS, "tool_choice": "none"}) is None


@pytest.mark.parametrize("parallel", [True, False, None])
def test_required_holds_the_reply_to_one_call(tok: Any, parallel: bool | None) -> None:
    body: dict[str, Any] = {"tools": TOOLS, "tool_choice": "required"}
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    grammar = grammar_of(tok, body)
    assert grammar_accepts(tok, grammar, CALL_REPLY)
    assert grammar_accepts(tok, grammar, ROLE_CALL)
    assert grammar_accepts(tok, grammar, CALL_REPLY.split("<|start|>assistant")[1])  # no analysis
    assert not grammar_accepts(tok, grammar, ISSUE_REPLY)  # a final answer
    assert not grammar_accepts(tok, grammar, BAD_ARGUMENTS, complete=False)
    assert not grammar_accepts(tok, grammar, UNKNOWN_FUNCTION, complete=False)
    assert not grammar_accepts(tok, grammar, CALL_REPLY.replace(',"unit":"celsius"}', ""))
    # One call per turn: parallel_tool_calls changes nothing, and no second message follows.
    second = CALL_REPLY + "<|end|><|start|>assistant"
    assert not grammar_accepts(tok, grammar, second, complete=False)
    assert grammar == grammar_of(tok, {"tools": TOOLS, "tool_choice": "required"})


def test_a_named_function_holds_the_reply_to_a_call_to_it(tok: Any) -> None:
    body = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    grammar = grammar_of(tok, body)
    assert grammar_accepts(tok, grammar, ROLE_CALL)
    assert not grammar_accepts(tok, grammar, CALL_REPLY, complete=False)
    assert not grammar_accepts(tok, grammar, ISSUE_REPLY, complete=False)


def test_auto_allows_an_answer_or_a_call(tok: Any) -> None:
    grammar = grammar_of(tok, {"tools": TOOLS, "tool_choice": "auto"})
    for reply_text in (ISSUE_REPLY, CALL_REPLY, ROLE_CALL, PREAMBLE_REPLY):
        assert grammar_accepts(tok, grammar, reply_text), reply_text
    assert grammar_accepts(tok, grammar, "<|channel|>final<|message|>Sunny, {as ever}.")
    assert not grammar_accepts(tok, grammar, BAD_ARGUMENTS, complete=False)
    assert not grammar_accepts(tok, grammar, UNKNOWN_FUNCTION, complete=False)
    # parallel_tool_calls false is the same grammar.
    assert grammar == grammar_of(tok, {"tools": TOOLS, "parallel_tool_calls": False})


def test_the_template_form_of_a_call_is_accepted(tok: Any) -> None:
    assistant = {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Need it.",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_time", "arguments": {"city": "Oslo"}}}
        ],
    }
    # The grammar writes compact JSON; the template's copy is spaced.
    reply_text = template_reply(tok, assistant, tools=TOOLS).replace('": "', '":"')
    grammar = grammar_of(tok, {"tools": TOOLS, "tool_choice": "required"})
    assert grammar_accepts(tok, grammar, reply_text)


def test_json_schema_holds_the_final_answer(tok: Any) -> None:
    grammar = grammar_of(tok, {"response_format": JSON_FORMAT})
    good = (
        "<|channel|>analysis<|message|>2+2=4.<|end|><|start|>assistant<|channel|>final<|message|>"
    )
    assert grammar_accepts(tok, grammar, good + '{"answer":4}')
    assert grammar_accepts(tok, grammar, '<|channel|>final<|message|>{"answer":4}')
    assert not grammar_accepts(tok, grammar, good + '{"answer":"four"}', complete=False)
    assert not grammar_accepts(tok, grammar, good + "4", complete=False)
    assert not grammar_accepts(tok, grammar, CALL_REPLY, complete=False)
    reply = HARMONY.read(generated(tok, good + '{"answer":4}'))
    assert (reply.reasoning, json.loads(reply.content or "")) == ("2+2=4.", {"answer": 4})


def test_json_schema_with_tools_auto(tok: Any) -> None:
    grammar = grammar_of(tok, {"tools": TOOLS, "response_format": JSON_FORMAT})
    assert grammar_accepts(tok, grammar, '<|channel|>final<|message|>{"answer":4}')
    assert grammar_accepts(tok, grammar, CALL_REPLY)
    assert not grammar_accepts(tok, grammar, ISSUE_REPLY, complete=False)


def test_grammar_without_the_vocabulary_writes_markers_as_text() -> None:
    grammar = HARMONY.grammar({"tools": TOOLS, "tool_choice": "required"})
    assert grammar is not None
    validate(grammar)
    assert '"<|channel|>"' in grammar
