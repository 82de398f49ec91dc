"""Llama 3.x (llama3_json) and Mistral (mistral, mistral_v11) dialects on the families' real
tokenizers and real chat templates (tests/formats): prompts render as the templates intend,
replies written as the templates render an assistant's turn come back as OpenAI's message, and
the grammars let exactly those replies through.

None of these families reasons: `reasoning_content` on an earlier turn is not rendered, a
reply's reasoning is always None (text that looks like `<think>` is content), and
`reasoning_effort` has no template variable (upload refuses it).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import llguidance
import llguidance.hf
import pytest

from inference.chat_completions import sampling_params
from inference.dialects import DIALECTS, Dialect, Marks, detect
from inference.dialects.llama3 import Llama3Json, call_schema, one_call_per_turn
from inference.dialects.mistral import MistralCalls, MistralV11Calls, template_id
from inference.engine.decoding import TextDecoder
from inference.structured import validate
from tests.dialects.conftest import as_generated, marks_for

LLAMA3, MISTRAL, MISTRAL_V11 = DIALECTS["llama3_json"], DIALECTS["mistral"], DIALECTS["mistral_v11"]
FAMILIES = {
    "llama3.1": LLAMA3,
    "llama3.2": LLAMA3,
    "llama3.3": LLAMA3,
    "mistral-nemo": MISTRAL,
    "mistral-small-3.2": MISTRAL_V11,
}
ALL_FAMILIES = list(FAMILIES)
LLAMAS = ["llama3.1", "llama3.2", "llama3.3"]

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
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
        "description": "The time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        },
    },
}
TOOLS = [WEATHER, TIME]
NAMES = ["get_weather", "get_time"]
PARIS = ("get_weather", '{"city":"Paris","unit":"celsius"}')
TOKYO = ("get_time", '{"timezone":"Asia/Tokyo"}')


def call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    """An earlier turn's call as Boardwalk hands it to the template: arguments as an object
    (the transformers convention), its own id (not 9 characters)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


CALL_PARIS = call(
    "get_weather", {"city": "Paris", "unit": "celsius"}, "call_3f2a9c0d1b7e4a6f8c5d2e1a"
)
CALL_TOKYO = call("get_time", {"timezone": "Asia/Tokyo"}, "call_9e8d7c6b5a4f3e2d1c0b9a8f")


_LLTOKENIZERS: dict[int, Any] = {}


def grammar_accepts(tokenizer: Any, grammar: str, reply: str) -> bool:
    """Whether the grammar lets the real tokenizer's tokens of `reply` through and lets it end
    there (conftest's helper, with llguidance's tokenizer built once per family: a 131k
    vocabulary takes seconds)."""
    if id(tokenizer) not in _LLTOKENIZERS:
        _LLTOKENIZERS[id(tokenizer)] = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=len(tokenizer)
        )
    matcher = llguidance.LLMatcher(_LLTOKENIZERS[id(tokenizer)], grammar, log_level=0)
    for token in tokenizer.encode(reply, add_special_tokens=False):
        if not matcher.consume_token(token):
            return False
    return matcher.is_accepting()


def marks_of(tokenizer: Any, dialect: Dialect) -> Marks:
    """The dialect's markers that are single tokens of the vocabulary, with their ids (Mistral's
    `[TOOL_CALLS]` and `[ARGS]` are written `<[id]>`), as the engine finds them."""
    return marks_for(tokenizer, dialect)


def render(tokenizer: Any, dialect: Dialect, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    kwargs.setdefault("add_generation_prompt", True)
    rendered = tokenizer.apply_chat_template(
        dialect.template_messages(messages), tokenize=False, **kwargs
    )
    assert isinstance(rendered, str)
    return rendered


def template_reply(tokenizer: Any, dialect: Dialect, calls: list[dict[str, Any]]) -> str:
    """The reply a model writes for `calls`: the assistant turn exactly as the family's template
    renders an earlier one, less the token that ends the turn."""
    asked = [{"role": "user", "content": "Weather in Paris, time in Tokyo?"}]
    prompt = render(tokenizer, dialect, asked, tools=TOOLS)
    turn = {"role": "assistant", "content": None, "tool_calls": calls}
    whole = render(tokenizer, dialect, [*asked, turn], tools=TOOLS, add_generation_prompt=False)
    assert whole.startswith(prompt), (prompt, whole)
    reply = whole[len(prompt) :]
    for end in ("<|eot_id|>", "<|eom_id|>", tokenizer.eos_token):
        reply = reply.removesuffix(end)
    return reply


def llama_reply(tokenizer: Any, calls: list[dict[str, Any]]) -> str:
    """Several Llama calls: each as the template renders it, separated by `; `."""
    return "; ".join(template_reply(tokenizer, LLAMA3, [c]) for c in calls)


def calls_reply(tokenizer: Any, dialect: Dialect, calls: list[dict[str, Any]]) -> str:
    if dialect is LLAMA3:
        return llama_reply(tokenizer, calls)
    return template_reply(tokenizer, dialect, calls)


def compact_reply(dialect: Dialect, calls: list[tuple[str, str]]) -> str:
    """Calls written as the grammar writes them."""
    if dialect is LLAMA3:
        return "; ".join(f'{{"name":{json.dumps(n)},"parameters":{a}}}' for n, a in calls)
    if dialect is MISTRAL:
        objects = [f'{{"name":{json.dumps(n)},"arguments":{a}}}' for n, a in calls]
        return "[TOOL_CALLS][" + ",".join(objects) + "]"
    return "".join(f"[TOOL_CALLS]{n}[ARGS]{a}" for n, a in calls)


@pytest.fixture(params=ALL_FAMILIES)
def family(request: pytest.FixtureRequest, family_tokenizer: Callable[[str], Any]) -> Any:
    name = request.param
    return name, family_tokenizer(name), FAMILIES[name]


# -- the families' tokens ---------------------------------------------------------------------


def test_the_markup_is_special_tokens_of_the_real_vocabularies(
    family_tokenizer: Callable[[str], Any],
) -> None:
    """The family directories name Llama 3.1's ids 128008/128010 `<|eom_id|>`/`<|python_tag|>`
    (the published vocabulary calls them reserved tokens) and give Mistral Small 3.2 its
    v11 control tokens `[ARGS]`/`[CALL_ID]` (32, 33)."""
    expected = {
        "llama3.1": {"<|eom_id|>": 128008, "<|eot_id|>": 128009, "<|python_tag|>": 128010},
        "mistral-nemo": {"[TOOL_CALLS]": 9},
        "mistral-small-3.2": {"[TOOL_CALLS]": 9, "[ARGS]": 32, "[CALL_ID]": 33},
    }
    for name, tokens in expected.items():
        tokenizer = family_tokenizer(name)
        for text, token_id in tokens.items():
            assert tokenizer.encode(text, add_special_tokens=False) == [token_id], (name, text)
            assert tokenizer.added_tokens_decoder[token_id].special, (name, text)
    assert "[ARGS]" not in family_tokenizer("mistral-nemo").get_vocab()


# -- detection --------------------------------------------------------------------------------


def test_detect_picks_the_dialect_of_each_real_template(
    family_tokenizer: Callable[[str], Any],
) -> None:
    from tests.formats.families import FAMILIES as KNOWN

    mine = {dialect.name for dialect in FAMILIES.values()}
    for name in KNOWN:
        dialect = detect(family_tokenizer(name).chat_template)
        if name in FAMILIES:
            assert dialect is FAMILIES[name], name
        else:
            assert dialect.name not in mine, (name, dialect.name)


# -- prompts ----------------------------------------------------------------------------------


def conversation(*calls: dict[str, Any]) -> list[dict[str, Any]]:
    results = [
        {"role": "tool", "tool_call_id": c["id"], "content": f"result of {c['function']['name']}"}
        for c in calls
    ]
    return [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hello there."},
        {"role": "assistant", "content": "Hi!", "reasoning_content": "A greeting: greet back."},
        {"role": "user", "content": "Weather in Paris, time in Tokyo?"},
        {"role": "assistant", "content": None, "tool_calls": list(calls)},
        *results,
        {"role": "assistant", "content": "Sunny in Paris; it is noon in Tokyo."},
        {"role": "user", "content": "Thanks."},
    ]


@pytest.mark.parametrize("name", LLAMAS)
def test_llama_renders_each_turn_as_its_template_intends(
    name: str, family_tokenizer: Callable[[str], Any]
) -> None:
    tokenizer = family_tokenizer(name)
    text = render(tokenizer, LLAMA3, conversation(CALL_PARIS), tools=TOOLS)
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
    assert "Environment: ipython\n" in text
    assert "Answer briefly.<|eot_id|>" in text
    # The tools go into the first user turn, with the format the model is asked to answer in.
    assert '{"name": function name, "parameters": dictionary of argument name' in text
    assert '"name": "get_weather"' in text and "Hello there.<|eot_id|>" in text
    assert "<|start_header_id|>assistant<|end_header_id|>\n\nHi!<|eot_id|>" in text
    assert "A greeting" not in text  # no reasoning in Llama 3's turns
    call_turn = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}'
    assert f"<|start_header_id|>assistant<|end_header_id|>\n\n{call_turn}<|eot_id|>" in text
    assert (
        '<|start_header_id|>ipython<|end_header_id|>\n\n"result of get_weather"<|eot_id|>' in text
    )
    assert text.endswith("Thanks.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


@pytest.mark.parametrize("name", LLAMAS)
def test_llama_renders_parallel_calls_as_one_call_per_turn(
    name: str, family_tokenizer: Callable[[str], Any]
) -> None:
    tokenizer = family_tokenizer(name)
    messages = conversation(CALL_PARIS, CALL_TOKYO)
    with pytest.raises(Exception, match="single tool-calls"):  # the template alone refuses them
        tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    text = render(tokenizer, LLAMA3, messages, tools=TOOLS)
    header = "<|start_header_id|>{}<|end_header_id|>\n\n"
    paris = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}'
    tokyo = '{"name": "get_time", "parameters": {"timezone": "Asia/Tokyo"}}'
    expected = (
        header.format("assistant") + paris + "<|eot_id|>"
        + header.format("ipython") + '"result of get_weather"<|eot_id|>'
        + header.format("assistant") + tokyo + "<|eot_id|>"
        + header.format("ipython") + '"result of get_time"<|eot_id|>'
    )  # fmt: skip
    assert expected in text


def test_one_call_per_turn_pairs_results_and_drops_empty_calls() -> None:
    results = [
        {"role": "tool", "tool_call_id": CALL_TOKYO["id"], "content": "noon"},
        {"role": "tool", "tool_call_id": "unknown", "content": "?"},
        {"role": "tool", "tool_call_id": CALL_PARIS["id"], "content": "sunny"},
    ]
    turn = {"role": "assistant", "content": None, "tool_calls": [CALL_PARIS, CALL_TOKYO]}
    out = one_call_per_turn([turn, *results, {"role": "assistant", "tool_calls": []}])
    assert [(m["role"], m.get("content")) for m in out] == [
        ("assistant", None),
        ("tool", "sunny"),
        ("assistant", None),
        ("tool", "noon"),
        ("tool", "?"),
        ("assistant", None),
    ]
    assert [m["tool_calls"] for m in out[::2][:2]] == [[CALL_PARIS], [CALL_TOKYO]]
    assert "tool_calls" not in out[-1]


def test_mistral_nemo_renders_each_turn_as_its_template_intends(
    family_tokenizer: Callable[[str], Any],
) -> None:
    tokenizer = family_tokenizer("mistral-nemo")
    messages = conversation(CALL_PARIS, CALL_TOKYO)
    with pytest.raises(Exception, match="length 9"):  # Boardwalk's ids, as they are
        tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    text = render(tokenizer, MISTRAL, messages, tools=TOOLS)
    paris, tokyo = template_id(CALL_PARIS["id"]), template_id(CALL_TOKYO["id"])
    assert len(paris) == 9 and paris.isalnum() and paris != tokyo
    assert text.startswith("<s>[INST]Hello there.[/INST]Hi!</s>")
    assert "A greeting" not in text
    assert (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}, '
        f'"id": "{paris}"}}, {{"name": "get_time", "arguments": {{"timezone": "Asia/Tokyo"}}, '
        f'"id": "{tokyo}"}}]</s>'
    ) in text
    assert f'[TOOL_RESULTS]{{"content": result of get_weather, "call_id": "{paris}"}}' in text
    assert f'[TOOL_RESULTS]{{"content": result of get_time, "call_id": "{tokyo}"}}' in text
    # The tools and the system message go with the last user turn.
    assert '[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather"' in text
    assert text.endswith("[/AVAILABLE_TOOLS][INST]Answer briefly.\n\nThanks.[/INST]")


def test_mistral_small_renders_each_turn_as_its_template_intends(
    family_tokenizer: Callable[[str], Any],
) -> None:
    tokenizer = family_tokenizer("mistral-small-3.2")
    messages = conversation(CALL_PARIS, CALL_TOKYO)
    with pytest.raises(Exception, match="length 9"):
        tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    text = render(tokenizer, MISTRAL_V11, messages, tools=TOOLS)
    paris, tokyo = template_id(CALL_PARIS["id"]), template_id(CALL_TOKYO["id"])
    assert text.startswith("<s>[SYSTEM_PROMPT]Answer briefly.[/SYSTEM_PROMPT][INST]Hello there.")
    assert "[/INST]Hi!</s>" in text and "A greeting" not in text
    assert (
        f'[TOOL_CALLS]get_weather[CALL_ID]{paris}[ARGS]{{"city": "Paris", "unit": "celsius"}}'
        f'[TOOL_CALLS]get_time[CALL_ID]{tokyo}[ARGS]{{"timezone": "Asia/Tokyo"}}</s>'
    ) in text
    assert f"[TOOL_RESULTS]{paris}[TOOL_CONTENT]result of get_weather[/TOOL_RESULTS]" in text
    assert f"[TOOL_RESULTS]{tokyo}[TOOL_CONTENT]result of get_time[/TOOL_RESULTS]" in text
    assert '[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather"' in text
    assert text.endswith("[/AVAILABLE_TOOLS][INST]Thanks.[/INST]")


def test_a_developer_message_renders_as_the_system_message(family: Any) -> None:
    """None of these templates knows a developer role (Llama's renders any role as a header,
    Mistral's refuse it): the dialects hand it over as the system message."""
    _, tokenizer, dialect = family
    messages = [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "Hello."},
    ]
    text = render(tokenizer, dialect, messages)
    assert "developer" not in text
    if dialect is LLAMA3:
        assert "<|start_header_id|>system<|end_header_id|>\n\n" in text
        assert "Answer in French.<|eot_id|>" in text
    elif dialect is MISTRAL:
        assert "[INST]Answer in French.\n\nHello.[/INST]" in text
    else:
        assert "[SYSTEM_PROMPT]Answer in French.[/SYSTEM_PROMPT][INST]Hello.[/INST]" in text


def test_these_dialects_take_no_reasoning_effort(family: Any) -> None:
    dialect = family[2]
    assert dialect.thinking is None and not dialect.efforts
    assert dialect.template_options({}) == {}
    assert dialect.template_options({"reasoning_effort": "high"}) == {}
    # reasoning_content is the field these templates would read, and they read none.
    turn = {"role": "assistant", "content": "Hi!", "reasoning_content": "why"}
    assert dialect.template_messages([turn]) == [turn]


# -- reading replies back ---------------------------------------------------------------------


def read(tokenizer: Any, dialect: Dialect, reply: str, names: list[str] = NAMES) -> Any:
    return dialect.read(as_generated(tokenizer, dialect, reply), names=names)


def test_a_plain_answer_is_content(family: Any) -> None:
    _, tokenizer, dialect = family
    reply = read(tokenizer, dialect, "It is sunny in Paris, {about} 25°C [source: me].")
    assert reply.content == "It is sunny in Paris, {about} 25°C [source: me]."
    assert reply.reasoning is None and reply.calls is None
    # Without reasoning, text that looks like it is content.
    reply = read(tokenizer, dialect, "<think>hmm</think>Sunny.")
    assert reply.content == "<think>hmm</think>Sunny." and reply.reasoning is None


def test_one_call_comes_back_as_written(family: Any) -> None:
    _, tokenizer, dialect = family
    text = calls_reply(tokenizer, dialect, [CALL_PARIS])
    reply = read(tokenizer, dialect, text)
    assert (reply.content, reply.reasoning, reply.calls) == (None, None, [PARIS])


def test_parallel_calls_come_back_in_order(family: Any) -> None:
    _, tokenizer, dialect = family
    text = calls_reply(tokenizer, dialect, [CALL_PARIS, CALL_TOKYO])
    reply = read(tokenizer, dialect, text)
    assert (reply.content, reply.calls) == (None, [PARIS, TOKYO])


def test_text_before_a_call_is_content(family: Any) -> None:
    _, tokenizer, dialect = family
    text = "Let me check {both}.\n\n" + calls_reply(tokenizer, dialect, [CALL_PARIS, CALL_TOKYO])
    reply = read(tokenizer, dialect, text)
    assert (reply.content, reply.calls) == ("Let me check {both}.", [PARIS, TOKYO])


def test_a_call_cut_by_max_tokens_keeps_its_arguments_so_far(family: Any) -> None:
    """Cut after every token of the reply: no content; once the name is written (or only one
    function begins as written) the call is there, with its arguments so far as written."""
    _, tokenizer, dialect = family
    text = calls_reply(tokenizer, dialect, [CALL_PARIS])
    written = re.split(r'\[ARGS\]|"(?:parameters|arguments)": ', text, maxsplit=1)[1]
    assert written.startswith('{"city"')
    ids = tokenizer.encode(text, add_special_tokens=False)
    decoder = TextDecoder(tokenizer, dialect.markup)
    named = False
    for k in range(1, len(ids) + 1):
        cut = decoder.decode(ids[:k])
        reply = dialect.read(cut, names=NAMES)
        assert reply.content is None, cut
        assert reply.calls is not None, cut
        if "get_w" in cut:
            named = True
        if named:
            assert len(reply.calls) == 1, cut
            name, arguments = reply.calls[0]
            assert name == "get_weather", cut
            assert written.startswith(arguments) or arguments == PARIS[1], (cut, arguments)
        else:
            assert reply.calls == [], cut
    assert named and reply.calls == [PARIS]


def test_a_parallel_call_cut_keeps_the_calls_before_it(family: Any) -> None:
    _, tokenizer, dialect = family
    text = calls_reply(tokenizer, dialect, [CALL_PARIS, CALL_TOKYO])
    named = text.index("get_time") + len("get_ti")
    assert read(tokenizer, dialect, text[:named]).calls == [PARIS, ("get_time", "")]
    at = text.index('"Asia/')
    assert read(tokenizer, dialect, text[:at]).calls == [PARIS, ("get_time", '{"timezone": ')]
    cut = read(tokenizer, dialect, text[: at + 3]).calls
    assert cut == [PARIS, ("get_time", '{"timezone": "As')]


def test_a_call_to_a_function_not_offered_is_content(family: Any) -> None:
    _, tokenizer, dialect = family
    text = calls_reply(tokenizer, dialect, [CALL_PARIS])
    reply = read(tokenizer, dialect, text, names=["get_time"])
    assert reply.calls is None and reply.content == text.strip()


def test_without_tools_a_call_is_read_as_text(family: Any) -> None:
    _, tokenizer, dialect = family
    text = calls_reply(tokenizer, dialect, [CALL_PARIS])
    reply = read(tokenizer, dialect, text, names=[])
    assert reply.calls is None and reply.content == text.strip()


@pytest.mark.parametrize("name", LLAMAS)
def test_llama_python_tag_before_a_call_is_dropped(
    name: str, family_tokenizer: Callable[[str], Any]
) -> None:
    """Llama 3.1 may begin a JSON call with `<|python_tag|>`: a special token that is not
    markup, so the decoder drops it and the call reads the same."""
    tokenizer = family_tokenizer(name)
    text = template_reply(tokenizer, LLAMA3, [CALL_PARIS])
    reply = read(tokenizer, LLAMA3, "<|python_tag|>" + text)
    assert (reply.content, reply.calls) == (None, [PARIS])


@pytest.mark.parametrize("name", LLAMAS)
def test_llama_json_that_is_no_call_stays_content(
    name: str, family_tokenizer: Callable[[str], Any]
) -> None:
    tokenizer = family_tokenizer(name)
    for text in (
        '{"name": "Alice", "age": 31}',
        '{"name": "get_weather", "parameters": {"city": "Paris"}, "note": 1}',
        '{"name": "get_weather", "parameters": {"city": "Paris"}} and then some text',
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "Alice"}',
    ):
        reply = read(tokenizer, LLAMA3, text)
        assert (reply.content, reply.calls) == (text, None), text


@pytest.mark.parametrize("name", LLAMAS)
def test_llama_reads_any_layout_and_separator(
    name: str, family_tokenizer: Callable[[str], Any]
) -> None:
    tokenizer = family_tokenizer(name)
    text = (
        '{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}}\n'
        '{ "name" : "get_time" , "parameters" : { "timezone" : "Asia/Tokyo" } };'
    )
    assert read(tokenizer, LLAMA3, text).calls == [PARIS, TOKYO]
    cut = '{"name" : "get_time" , "parameters" : { "timezone" : "Asia/T'
    assert read(tokenizer, LLAMA3, cut).calls == [("get_time", '{ "timezone" : "Asia/T')]


def test_mistral_nemo_reads_a_blank_after_the_marker_and_drops_ids(
    family_tokenizer: Callable[[str], Any],
) -> None:
    tokenizer = family_tokenizer("mistral-nemo")
    text = (
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
        '"celsius"}, "id": "a1b2c3d4e"},\n {"id": "z", "name": "get_time", "arguments": '
        '{"timezone": "Asia/Tokyo"}}]'
    )
    assert read(tokenizer, MISTRAL, text).calls == [PARIS, TOKYO]
    assert read(tokenizer, MISTRAL, text + " trailing").calls is None
    cut = text[: text.index('"id": "a1b2') + 9]  # the arguments whole, the id cut
    assert read(tokenizer, MISTRAL, cut).calls == [PARIS]


def test_mistral_small_reads_calls_without_ids(family_tokenizer: Callable[[str], Any]) -> None:
    tokenizer = family_tokenizer("mistral-small-3.2")
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}[TOOL_CALLS]get_time'
    assert read(tokenizer, MISTRAL_V11, text).calls == [PARIS, ("get_time", "")]
    assert read(tokenizer, MISTRAL_V11, text + "[ARGS]").calls == [PARIS, ("get_time", "")]
    broken = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"} oops[TOOL_CALLS]get_time[ARGS]{}'
    assert read(tokenizer, MISTRAL_V11, broken).calls is None


def test_the_stream_shows_text_before_a_call_and_holds_the_call_back(family: Any) -> None:
    """Each view of the growing reply extends the one before and ends as `read` does."""
    _, tokenizer, dialect = family
    text = "Let me check {both}.\n\n" + calls_reply(tokenizer, dialect, [CALL_PARIS, CALL_TOKYO])
    ids = tokenizer.encode(text, add_special_tokens=False)
    decoder = TextDecoder(tokenizer, dialect.markup)
    shown = ""
    for k in range(1, len(ids) + 1):
        reasoning, content = dialect.stream_view(decoder.decode(ids[:k]))
        assert reasoning == ""
        assert content.startswith(shown), (shown, content)
        shown = content
    assert shown == "Let me check {both}."


# -- grammars ---------------------------------------------------------------------------------


def grammar(tokenizer: Any, dialect: Dialect, **body: Any) -> str:
    text = dialect.grammar(body, marks=marks_of(tokenizer, dialect))
    assert text is not None
    validate(text)
    return text


def test_the_grammar_writes_mistral_markers_as_their_tokens(
    family_tokenizer: Callable[[str], Any],
) -> None:
    nemo = family_tokenizer("mistral-nemo")
    lines = MistralCalls().calls_rules([WEATHER], parallel=True, marks=marks_of(nemo, MISTRAL))
    assert lines[0] == 'calls: <[9]> "[" call ("," call)* "]"'
    small = family_tokenizer("mistral-small-3.2")
    lines = MistralV11Calls().calls_rules(
        [WEATHER], parallel=False, marks=marks_of(small, MISTRAL_V11)
    )
    assert lines[:3] == [
        "calls: call",
        "call: <[9]> (call_0)",
        'call_0: "get_weather" <[32]> arguments_0',
    ]
    # At upload no vocabulary is loaded: markers are text (the grammar still compiles).
    assert MISTRAL.grammar({"tools": [WEATHER], "tool_choice": "required"}) is not None
    llama = Llama3Json().calls_rules([WEATHER], parallel=True, marks=Marks())
    assert llama[0] == 'calls: call ("; " call)*'


def test_the_engine_writes_mistral_grammars_with_the_marker_tokens(
    family_tokenizer: Callable[[str], Any],
) -> None:
    """The grammar a worker builds for a revision (`sampling_params` with its tokenizer) writes
    `[TOOL_CALLS]` and `[ARGS]` by id: spelled as text, no token the model writes matches
    them and every forced call dies at its first token."""
    for name, dialect in (("mistral-nemo", MISTRAL), ("mistral-small-3.2", MISTRAL_V11)):
        revision = copy.copy(family_tokenizer(name))  # as a worker loads it: dialect attached
        revision.dialect = dialect
        body = {"messages": [], "max_tokens": 50, "tools": TOOLS, "tool_choice": "required"}
        params = sampling_params(body, tokenizer=revision)
        assert params.constraint is not None
        reply = compact_reply(dialect, [PARIS])
        assert grammar_accepts(revision, params.constraint.grammar, reply), name


def test_required_and_named_calls(family: Any) -> None:
    _, tokenizer, dialect = family
    one, two = compact_reply(dialect, [PARIS]), compact_reply(dialect, [PARIS, TOKYO])
    required = grammar(tokenizer, dialect, tools=TOOLS, tool_choice="required")
    assert grammar_accepts(tokenizer, required, one)
    assert grammar_accepts(tokenizer, required, two)
    assert not grammar_accepts(tokenizer, required, "Sunny.")
    named = grammar(
        tokenizer,
        dialect,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    assert grammar_accepts(tokenizer, named, compact_reply(dialect, [TOKYO]))
    assert not grammar_accepts(tokenizer, named, one)
    assert not grammar_accepts(tokenizer, named, compact_reply(dialect, [TOKYO, TOKYO]))
    # What the grammar lets through reads back as the calls.
    assert read(tokenizer, dialect, two).calls == [PARIS, TOKYO]


def test_parallel_tool_calls_false_allows_one_call(family: Any) -> None:
    _, tokenizer, dialect = family
    text = grammar(tokenizer, dialect, tools=TOOLS, parallel_tool_calls=False)
    assert grammar_accepts(tokenizer, text, compact_reply(dialect, [TOKYO]))
    assert not grammar_accepts(tokenizer, text, compact_reply(dialect, [PARIS, TOKYO]))


def test_auto_allows_text_or_calls(family: Any) -> None:
    _, tokenizer, dialect = family
    text = grammar(tokenizer, dialect, tools=TOOLS, tool_choice="auto")
    assert grammar_accepts(tokenizer, text, "It is sunny in Paris.")
    assert grammar_accepts(tokenizer, text, compact_reply(dialect, [PARIS, TOKYO]))
    # Mistral's calls may follow text, still held to their schemas. Llama's reply is text or
    # calls (a text lexeme and a JSON schema cannot begin at the same place in llguidance),
    # and its text never writes a call's start, so no call escapes its schema.
    before = "Let me check {both}.\n" + compact_reply(dialect, [PARIS, TOKYO])
    assert grammar_accepts(tokenizer, text, before) == (dialect is not LLAMA3)
    assert read(tokenizer, dialect, before).calls == [PARIS, TOKYO]
    bad = "Let me check.\n" + compact_reply(dialect, [("get_weather", '{"city":3}')])
    assert not grammar_accepts(tokenizer, text, bad)
    if dialect is LLAMA3:
        assert grammar_accepts(tokenizer, text, 'Use {"city": "Paris"} as the body.')
        assert not grammar_accepts(tokenizer, text, '{"answer": 1}')


def test_arguments_are_held_to_the_schema(family: Any) -> None:
    _, tokenizer, dialect = family
    text = grammar(tokenizer, dialect, tools=TOOLS, tool_choice="required")
    for arguments in ('{"city":3}', '{"unit":"celsius"}', '{"city":"Paris","unit":"kelvin"}'):
        bad = compact_reply(dialect, [("get_weather", arguments)])
        assert not grammar_accepts(tokenizer, text, bad), arguments
    # The model's own spaced layout is not what the grammar writes.
    spaced = calls_reply(tokenizer, dialect, [CALL_PARIS])
    assert not grammar_accepts(tokenizer, text, spaced)
    assert not grammar_accepts(tokenizer, text, compact_reply(dialect, [("get_date", "{}")]))


def test_json_schema_answer(family: Any) -> None:
    _, tokenizer, dialect = family
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    text = grammar(tokenizer, dialect, response_format=response_format)
    assert grammar_accepts(tokenizer, text, '{"answer":"yes"}')
    assert not grammar_accepts(tokenizer, text, '{"answer":3}')
    assert not grammar_accepts(tokenizer, text, "yes")
    with_tools = grammar(tokenizer, dialect, response_format=response_format, tools=TOOLS)
    assert grammar_accepts(tokenizer, with_tools, '{"answer":"yes"}')
    assert grammar_accepts(tokenizer, with_tools, compact_reply(dialect, [PARIS]))
    assert read(tokenizer, dialect, '{"answer":"yes"}').content == '{"answer":"yes"}'


def test_llama_calls_are_one_schema_with_the_definitions_at_its_root() -> None:
    parameters = {
        "type": "object",
        "properties": {"place": {"$ref": "#/$defs/place"}},
        "required": ["place"],
        "$defs": {"place": {"type": "string", "minLength": 2}},
    }
    whole = call_schema("locate", parameters)
    assert whole is not None and whole["$defs"] == parameters["$defs"]
    assert list(whole["properties"]) == ["name", "parameters"]
    assert "$defs" not in whole["properties"]["parameters"]
    tool = {"type": "function", "function": {"name": "locate", "parameters": parameters}}
    text = LLAMA3.grammar({"tools": [tool], "tool_choice": "required"})
    assert text is not None
    validate(text)
    # A reference elsewhere into the parameters: the name is a literal, the parameters a schema
    # of their own (as before the call was one schema).
    recursive = {"type": "object", "properties": {"child": {"$ref": "#"}}}
    assert call_schema("tree", recursive) is None
    tool = {"type": "function", "function": {"name": "tree", "parameters": recursive}}
    lines = Llama3Json().calls_rules([tool], parallel=False, marks=Marks())
    assert lines[2] == 'call_0: "{\\"name\\":\\"tree\\",\\"parameters\\":" arguments_0 "}"'


@pytest.mark.parametrize("name", ["llama3.1", "mistral-nemo", "mistral-small-3.2"])
def test_definitions_in_the_parameters_are_enforced(
    name: str, family_tokenizer: Callable[[str], Any]
) -> None:
    tokenizer, dialect = family_tokenizer(name), FAMILIES[name]
    parameters = {
        "type": "object",
        "properties": {"place": {"$ref": "#/$defs/place"}},
        "required": ["place"],
        "additionalProperties": False,
        "$defs": {"place": {"type": "string", "enum": ["Paris", "Lyon"]}},
    }
    tool = {"type": "function", "function": {"name": "locate", "parameters": parameters}}
    text = grammar(tokenizer, dialect, tools=[tool, TIME], tool_choice="required")
    assert grammar_accepts(
        tokenizer, text, compact_reply(dialect, [("locate", '{"place":"Lyon"}')])
    )
    assert not grammar_accepts(
        tokenizer, text, compact_reply(dialect, [("locate", '{"place":"Nice"}')])
    )
