"""DeepSeek V3.1 (`deepseek_v3`), Qwen3-Coder (`qwen3_coder`) and the DeepSeek-R1 distills
(`deepseek_r1`) on their real tokenizers and chat templates (tests/formats).

Replies are written as each template writes an earlier assistant turn (what the model was
trained to write), tokenized by the real tokenizer and decoded as the engine decodes them
(`as_generated`); grammars are run over the real tokens (llguidance).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import llguidance
import llguidance.hf
import pytest

from inference.dialects import DIALECTS, Dialect, detect
from inference.dialects.streams import ReplyStream
from inference.engine.decoding import TextDecoder
from inference.structured import validate
from tests.dialects.conftest import as_generated, load_family, marks_for
from tests.formats.families import FAMILIES, family_dir

DEEPSEEK_V3 = DIALECTS["deepseek_v3"]
QWEN3_CODER = DIALECTS["qwen3_coder"]
DEEPSEEK_R1 = DIALECTS["deepseek_r1"]

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
EOS = "<｜end▁of▁sentence｜>"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["CET", "UTC"]}},
            "required": ["zone"],
        },
    },
}
# Parameters of every JSON type, and a code string, for Qwen3-Coder's raw-text values.
EDIT = {
    "type": "function",
    "function": {
        "name": "write_file",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "content": {"type": "string"},
                "mode": {"$ref": "#/$defs/mode"},
                "lines": {"type": "array", "items": {"type": "integer"}},
                "options": {
                    "type": "object",
                    "properties": {"backup": {"type": "boolean"}},
                    "required": ["backup"],
                    "additionalProperties": False,
                },
                "overwrite": {"type": "boolean"},
                "owner": {"type": ["string", "null"]},
            },
            "required": ["path", "content", "overwrite"],
            "$defs": {"mode": {"type": "string", "enum": ["text", "binary"]}},
        },
    },
}
TOOLS = [WEATHER, CLOCK]
NAMES = ["get_weather", "get_time"]
CODE = 'def f(x):\n    if x < 1:\n        return "<b>"\n    return x\n'


def call(name: str, arguments: dict[str, Any], index: int = 0) -> dict[str, Any]:
    """An earlier turn's tool call as the engine hands it to a template (arguments as an
    object: inference/rendering.py)."""
    return {
        "id": f"c{index}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def render(
    tokenizer: Any,
    dialect: Dialect,
    messages: list[dict[str, Any]],
    body: dict[str, Any] | None = None,
    *,
    prompt: bool = True,
) -> str:
    body = body or {}
    rendered = tokenizer.apply_chat_template(
        dialect.template_messages(messages),
        tools=body.get("tools"),
        add_generation_prompt=prompt,
        tokenize=False,
        **dialect.template_options(body),
    )
    assert isinstance(rendered, str)
    return rendered


def written_reply(
    tokenizer: Any, dialect: Dialect, assistant: dict[str, Any], end: str, **options: Any
) -> str:
    """What the model writes for `assistant`: the template's rendering of that turn after the
    generation prompt, less the token that ends the turn."""
    user = [{"role": "user", "content": "Weather in Paris, and the time?"}]
    prompt = tokenizer.apply_chat_template(
        user, add_generation_prompt=True, tokenize=False, **options
    )
    whole = tokenizer.apply_chat_template([*user, assistant], tokenize=False, **options)
    assert whole.startswith(prompt), (prompt, whole)
    reply = whole[len(prompt) :]
    assert reply.rstrip().endswith(end), reply
    return reply.rstrip()[: -len(end)]


_LLTOKENIZERS: dict[int, Any] = {}


def accepts(tokenizer: Any, grammar: str, reply: str) -> bool:
    """conftest's grammar_accepts, with the llguidance tokenizer built once per tokenizer
    (building it takes seconds on a 150k vocabulary)."""
    validate(grammar)
    key = id(tokenizer)
    if key not in _LLTOKENIZERS:
        _LLTOKENIZERS[key] = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))
    matcher = llguidance.LLMatcher(_LLTOKENIZERS[key], grammar, log_level=0)
    for token in tokenizer.encode(reply, add_special_tokens=False):
        if not matcher.consume_token(token):
            return False
    return matcher.is_accepting()


def check_cuts(
    tokenizer: Any,
    dialect: Dialect,
    reply: str,
    *,
    calls: list[tuple[str, str]],
    content: str | None = None,
    reasoning: str | None = None,
    opened: bool = False,
    names: Sequence[str] = NAMES,
) -> int:
    """Read `reply` cut after each of its tokens (as `max_tokens` cuts it): the reasoning and
    content so far, then the calls, each a name once known and its arguments so far (a prefix
    of what they end as); the whole reply reads as expected. The number of cuts seen inside a
    call is returned."""
    ids = tokenizer.encode(reply, add_special_tokens=False)
    decoder = TextDecoder(tokenizer, dialect.markup)
    inside_calls = 0
    for k in range(1, len(ids) + 1):
        text = decoder.decode(ids[:k])
        read = dialect.read(text, names=names, opened=opened)
        if read.calls is None:
            if read.content is None:  # still inside the reasoning
                assert reasoning is not None and reasoning.startswith(read.reasoning or "")
            continue
        inside_calls += 1
        assert read.content == content, (text, read)
        assert read.reasoning == reasoning
        assert len(read.calls) <= len(calls)
        for i, (name, arguments) in enumerate(read.calls):
            assert name == calls[i][0], (text, read)
            assert calls[i][1].startswith(arguments), (text, read)
            if i < len(read.calls) - 1:
                assert arguments == calls[i][1]
    whole = dialect.read(decoder.decode(ids), names=names, opened=opened)
    assert (whole.content, whole.reasoning, whole.calls) == (content, reasoning, calls)
    return inside_calls


@pytest.fixture
def deepseek(family_tokenizer: Callable[[str], Any]) -> Any:
    return family_tokenizer("deepseek-v3.1")


@pytest.fixture
def coder(family_tokenizer: Callable[[str], Any]) -> Any:
    return family_tokenizer("qwen3-coder")


# -- detection ----------------------------------------------------------------------------


def _template(name: str) -> str:
    directory = family_dir(name)
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    return str(config["chat_template"])


def test_detect_picks_these_dialects_for_their_families_only() -> None:
    ours = {
        "deepseek-v3.1": "deepseek_v3",
        "qwen3-coder": "qwen3_coder",
        "deepseek-r1-distill-qwen": "deepseek_r1",
        "deepseek-r1-distill-llama": "deepseek_r1",
    }
    for name in FAMILIES:
        found = detect(_template(name)).name
        if name in ours:
            assert found == ours[name], name
        else:
            assert found not in ours.values(), (name, found)


# -- DeepSeek V3.1: prompts ---------------------------------------------------------------


def test_deepseek_markers_are_single_added_tokens_kept_in_the_text(deepseek: Any) -> None:
    vocab = deepseek.get_vocab()
    for marker in (*DEEPSEEK_V3.markup, "<think>", "</think>"):
        assert marker in vocab, marker
        assert deepseek.encode(marker, add_special_tokens=False) == [vocab[marker]]
    # Not special in DeepSeek's vocabulary: a decoder that skips special tokens keeps them.
    assert not {vocab[m] for m in DEEPSEEK_V3.markup} & set(deepseek.all_special_ids)
    assert DEEPSEEK_V3.tools is not None
    assert DEEPSEEK_V3.tools.markup == (CALLS_BEGIN, CALL_BEGIN, SEP, CALL_END, CALLS_END)
    assert DEEPSEEK_V3.markup == (*DEEPSEEK_V3.tools.markup, "<think>", "</think>")
    assert set(marks_for(deepseek, DEEPSEEK_V3).single_tokens) == {
        *DEEPSEEK_V3.markup,
        "<think>",
        "</think>",
    }


def test_deepseek_renders_every_role_as_its_template_intends(deepseek: Any) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "They ask weather."},
        {"role": "user", "content": "And tomorrow, and the time?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                call("get_weather", {"city": "Paris", "days": 2}),
                call("get_time", {"zone": "CET"}, 1),
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "rain"},
        {"role": "tool", "tool_call_id": "c1", "content": "noon"},
        {"role": "assistant", "content": "Rain, at noon."},
        {"role": "user", "content": "Thanks"},
    ]
    text = render(deepseek, DEEPSEEK_V3, messages, {"tools": TOOLS})
    # V3.1's template knows no developer role (it would drop the message): it comes as a
    # system message, and the template joins them all at the prompt's start.
    assert text.startswith(
        "<｜begin▁of▁sentence｜>You are terse.\n\nAnswer in French.<｜User｜>Weather in Paris?"
    )
    dropped = deepseek.apply_chat_template(messages, tokenize=False)
    assert "Answer in French." not in dropped
    # An earlier turn's reasoning is not shown again: its answer follows an empty one.
    assert "They ask weather." not in text
    assert f"<｜Assistant｜><think></think>Sunny.{EOS}" in text
    assert (
        "<｜Assistant｜><think></think>Let me check."
        + CALLS_BEGIN
        + f'{CALL_BEGIN}get_weather{SEP}{{"city": "Paris", "days": 2}}{CALL_END}'
        + f'{CALL_BEGIN}get_time{SEP}{{"zone": "CET"}}{CALL_END}'
        + CALLS_END
        + EOS
    ) in text
    assert (
        "<｜tool▁output▁begin｜>rain<｜tool▁output▁end｜>"
        "<｜tool▁output▁begin｜>noon<｜tool▁output▁end｜>"
        f"Rain, at noon.{EOS}"
    ) in text
    assert text.endswith("<｜User｜>Thanks<｜Assistant｜><think></think>")


@pytest.mark.parametrize(
    ("effort", "options", "tail"),
    [
        (None, {}, "<think></think>"),  # the template's default: no thinking
        ("none", {"thinking": False}, "<think></think>"),
        ("minimal", {"thinking": False}, "<think></think>"),
        ("low", {"thinking": True}, "<think>"),
        ("high", {"thinking": True}, "<think>"),
    ],
)
def test_deepseek_reasoning_effort_switches_thinking(
    deepseek: Any, effort: str | None, options: dict[str, Any], tail: str
) -> None:
    body = {"reasoning_effort": effort} if effort else {}
    assert DEEPSEEK_V3.template_options(body) == options
    text = render(deepseek, DEEPSEEK_V3, [{"role": "user", "content": "Hi"}], body)
    assert text.endswith("<｜User｜>Hi<｜Assistant｜>" + tail)
    # Thinking on: the prompt opens the reasoning, and the reply begins inside it; off: the
    # prompt closes an empty one, and the reply is the answer alone.
    assert DEEPSEEK_V3.opened(text[-40:]) is (tail == "<think>")
    assert DEEPSEEK_V3.closed(text[-40:]) is (tail != "<think>")


# -- DeepSeek V3.1: replies read back ------------------------------------------------------


def _deepseek_call_reply(deepseek: Any, content: str = "") -> str:
    assistant = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            call("get_weather", {"city": "Paris", "days": 2}),
            call("get_time", {"zone": "CET"}, 1),
        ],
    }
    return written_reply(deepseek, DEEPSEEK_V3, assistant, EOS)


def test_deepseek_reads_parallel_calls_as_the_template_writes_them(deepseek: Any) -> None:
    reply = _deepseek_call_reply(deepseek)
    assert reply.startswith(CALLS_BEGIN + CALL_BEGIN + "get_weather" + SEP)
    read = DEEPSEEK_V3.read(as_generated(deepseek, DEEPSEEK_V3, reply), names=NAMES)
    assert read.content is None and read.reasoning is None
    assert read.calls == [
        ("get_weather", '{"city":"Paris","days":2}'),
        ("get_time", '{"zone":"CET"}'),
    ]


def test_deepseek_reads_one_call_and_text_before_it(deepseek: Any) -> None:
    assistant = {
        "role": "assistant",
        "content": "Let me look that up.",
        "tool_calls": [call("get_weather", {"city": "Zürich"})],
    }
    reply = written_reply(deepseek, DEEPSEEK_V3, assistant, EOS)
    read = DEEPSEEK_V3.read(as_generated(deepseek, DEEPSEEK_V3, reply), names=NAMES)
    assert read.content == "Let me look that up."
    assert read.calls == [("get_weather", '{"city":"Zürich"}')]


def test_deepseek_reads_reasoning_then_answer_or_calls(deepseek: Any) -> None:
    # Thinking on: the prompt ended with <think>, the reply closes it.
    reply = "The user greets me.\nI greet back.</think>Hello!"
    read = DEEPSEEK_V3.read(as_generated(deepseek, DEEPSEEK_V3, reply), names=NAMES, opened=True)
    assert (read.reasoning, read.content, read.calls) == (
        "The user greets me.\nI greet back.",
        "Hello!",
        None,
    )
    text = as_generated(deepseek, DEEPSEEK_V3, reply)
    assert text[read.answer_at :] == "Hello!"
    reply = f'Need the forecast.</think>{CALLS_BEGIN}{CALL_BEGIN}get_weather{SEP}{{"city":"Oslo"}}'
    reply += CALL_END + CALLS_END
    read = DEEPSEEK_V3.read(as_generated(deepseek, DEEPSEEK_V3, reply), names=NAMES, opened=True)
    assert (read.reasoning, read.content) == ("Need the forecast.", None)
    assert read.calls == [("get_weather", '{"city":"Oslo"}')]
    # Thinking off: the answer straight away.
    read = DEEPSEEK_V3.read(as_generated(deepseek, DEEPSEEK_V3, "Hello!"), names=NAMES)
    assert (read.reasoning, read.content, read.calls) == (None, "Hello!", None)


def test_deepseek_reasoning_cut_by_max_tokens_or_a_stop_string(deepseek: Any) -> None:
    cut = as_generated(deepseek, DEEPSEEK_V3, "First, the city. Then the STOP date")
    read = DEEPSEEK_V3.read(cut, names=NAMES, opened=True)
    assert (read.content, read.reasoning, read.calls) == (
        None,
        "First, the city. Then the STOP date",
        None,
    )
    assert read.answer_at == len(cut)
    # A stop string inside the reasoning cuts the text there: still no answer.
    stopped = cut[: cut.index("STOP")]
    read = DEEPSEEK_V3.read(stopped, names=NAMES, opened=True)
    assert (read.content, read.reasoning) == (None, "First, the city. Then the")


def test_deepseek_call_cut_anywhere_keeps_what_is_written(deepseek: Any) -> None:
    # As the grammar writes it: compact arguments.
    reply = (
        f"Checking.{CALLS_BEGIN}"
        f'{CALL_BEGIN}get_weather{SEP}{{"city":"Paris","days":2}}{CALL_END}'
        f'{CALL_BEGIN}get_time{SEP}{{"zone":"CET"}}{CALL_END}{CALLS_END}'
    )
    expected = [("get_weather", '{"city":"Paris","days":2}'), ("get_time", '{"zone":"CET"}')]
    assert check_cuts(deepseek, DEEPSEEK_V3, reply, calls=expected, content="Checking.") > 10
    # At some points by hand: in a name (unknown while it could be either), in the arguments.
    decoder = TextDecoder(deepseek, DEEPSEEK_V3.markup)

    def read(text: str) -> Any:
        return DEEPSEEK_V3.read(
            decoder.decode(deepseek.encode(text, add_special_tokens=False)), names=NAMES
        )

    assert read(CALLS_BEGIN).calls == []  # a call begins; no name yet
    assert read(CALLS_BEGIN + CALL_BEGIN + "get").calls == []
    assert read(CALLS_BEGIN + CALL_BEGIN + "get_w").calls == [("get_weather", "")]
    assert read(CALLS_BEGIN + CALL_BEGIN + "get_time" + SEP).calls == [("get_time", "")]
    assert read(f'{CALLS_BEGIN}{CALL_BEGIN}get_weather{SEP}{{"city":"Par').calls == [
        ("get_weather", '{"city":"Par')
    ]
    done = f'{CALLS_BEGIN}{CALL_BEGIN}get_weather{SEP}{{"city":"Paris"}}{CALL_END}'
    assert read(done).calls == [("get_weather", '{"city":"Paris"}')]


def test_deepseek_other_text_is_content(deepseek: Any) -> None:
    for reply in (
        "Plain answer, no calls.",
        f"{CALLS_BEGIN}{CALL_BEGIN}get_weather{SEP}not json{CALL_END}{CALLS_END}",
        f'{CALLS_BEGIN}{CALL_BEGIN}get_time{SEP}{{"zone":"CET"}}{CALL_END}{CALLS_END} and more',
        f"{CALLS_BEGIN}text where a call should be",
    ):
        text = as_generated(deepseek, DEEPSEEK_V3, reply)
        read = DEEPSEEK_V3.read(text, names=NAMES)
        assert (read.content, read.calls) == (text, None), reply


# -- DeepSeek V3.1: grammars --------------------------------------------------------------


def _ds_call(name: str, arguments: str) -> str:
    return f"{CALL_BEGIN}{name}{SEP}{arguments}{CALL_END}"


def test_deepseek_grammars_take_the_family_syntax(deepseek: Any) -> None:
    marks = marks_for(deepseek, DEEPSEEK_V3)
    one = CALLS_BEGIN + _ds_call("get_weather", '{"city":"Paris","days":2}') + CALLS_END
    two = (
        CALLS_BEGIN
        + _ds_call("get_weather", '{"city":"Paris"}')
        + _ds_call("get_time", '{"zone":"UTC"}')
        + CALLS_END
    )
    bad_enum = CALLS_BEGIN + _ds_call("get_time", '{"zone":"PST"}') + CALLS_END
    missing = CALLS_BEGIN + _ds_call("get_weather", '{"days":2}') + CALLS_END
    spaced = CALLS_BEGIN + _ds_call("get_weather", '{"city": "Paris"}') + CALLS_END

    def grammar(body: dict[str, Any], *, opened: bool = False) -> str:
        found = DEEPSEEK_V3.grammar(body, marks=marks, opened=opened)
        assert found is not None
        return found

    required = grammar({"tools": TOOLS, "tool_choice": "required"})
    assert accepts(deepseek, required, one)
    assert accepts(deepseek, required, two)
    for reply in (bad_enum, missing, spaced, "No call.", CALLS_BEGIN + CALLS_END):
        assert not accepts(deepseek, required, reply), reply
    # Thinking off: the prompt closed the reasoning, the reply is the calls alone; thinking
    # on: reasoning, then the calls.
    closed = DEEPSEEK_V3.grammar(
        {"tools": TOOLS, "tool_choice": "required"}, marks=marks, closed=True
    )
    assert closed is not None
    assert accepts(deepseek, closed, one)
    assert not accepts(deepseek, closed, "<think></think>" + one)
    thinking = grammar({"tools": TOOLS, "tool_choice": "required"}, opened=True)
    assert accepts(deepseek, thinking, "Paris, so get_weather.\n</think>" + one)
    assert not accepts(deepseek, thinking, one)

    single = grammar({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False})
    assert accepts(deepseek, single, one)
    assert not accepts(deepseek, single, two)

    named = grammar(
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    )
    assert accepts(
        deepseek, named, CALLS_BEGIN + _ds_call("get_time", '{"zone":"CET"}') + CALLS_END
    )
    assert not accepts(deepseek, named, one)
    assert not accepts(deepseek, named, two)

    auto = grammar({"tools": TOOLS})
    assert accepts(deepseek, auto, "It is sunny in Paris.")
    assert accepts(deepseek, auto, two)
    assert accepts(deepseek, auto, "Let me look.\n" + one)  # text, then the calls
    assert not accepts(deepseek, auto, bad_enum)

    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
    }
    json_body = {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    assert accepts(deepseek, grammar(json_body), '{"answer":"yes","sure":true}')
    assert not accepts(deepseek, grammar(json_body), '{"answer":"yes"}')
    assert accepts(
        deepseek, grammar(json_body, opened=True), 'Easy.</think>{"answer":"no","sure":false}'
    )
    assert not accepts(deepseek, grammar(json_body, opened=True), '{"answer":"no","sure":false}')
    # Tools beside a schema: the schema's JSON or the calls.
    both = grammar({**json_body, "tools": TOOLS})
    assert accepts(deepseek, both, '{"answer":"yes","sure":true}')
    assert accepts(deepseek, both, one)
    assert not accepts(deepseek, both, "Free text.")

    # What the grammar lets through reads back as the calls.
    read = DEEPSEEK_V3.read(as_generated(deepseek, DEEPSEEK_V3, two), names=NAMES)
    assert read.calls == [("get_weather", '{"city":"Paris"}'), ("get_time", '{"zone":"UTC"}')]


# -- Qwen3-Coder: prompts ------------------------------------------------------------------


def test_coder_markers(coder: Any) -> None:
    vocab = coder.get_vocab()
    assert QWEN3_CODER.markup == ("<tool_call>", "</tool_call>")
    for marker in QWEN3_CODER.markup:
        assert coder.encode(marker, add_special_tokens=False) == [vocab[marker]]
    # `<function=` and `<parameter=` are plain text.
    assert len(coder.encode("<function=", add_special_tokens=False)) > 1
    assert set(marks_for(coder, QWEN3_CODER).single_tokens) == set(QWEN3_CODER.markup)
    assert QWEN3_CODER.thinking is None and not QWEN3_CODER.efforts  # reasoning_effort refused
    # A ChatML turn ends with <|im_end|> (one special token).
    assert QWEN3_CODER.turn_ends == ("<|im_end|>",)
    assert coder.encode("<|im_end|>", add_special_tokens=False) == [vocab["<|im_end|>"]]
    assert QWEN3_CODER.template_options({"reasoning_effort": "high"}) == {}


def test_coder_renders_every_role_as_its_template_intends(coder: Any) -> None:
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "developer", "content": "Prefer Python."},
        {"role": "user", "content": "Save f, then weather?"},
        {"role": "assistant", "content": "Which file?", "reasoning_content": "Unclear path."},
        {"role": "user", "content": "f.py"},
        {
            "role": "assistant",
            "content": "Writing it.",
            "tool_calls": [
                call(
                    "write_file",
                    {"path": "f.py", "content": CODE, "lines": [1, 2], "options": {"backup": True}},
                ),
                call("get_weather", {"city": "Paris", "days": 2}, 1),
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "saved"},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        {"role": "assistant", "content": "Saved; rain."},
    ]
    text = render(coder, QWEN3_CODER, messages, {"tools": [*TOOLS, EDIT]})
    assert text.startswith("<|im_start|>system\nYou are a coding agent.\n\n# Tools\n")
    assert "<function>\n<name>get_weather</name>\n<description>The forecast for a city." in text
    assert "<parameter>\n<name>city</name>\n<type>string</type>" in text
    # A developer message comes as a system one (the template would render a role of that
    # name, which Qwen was never trained on).
    assert "<|im_start|>system\nPrefer Python.<|im_end|>\n" in text
    assert "<|im_start|>developer" in coder.apply_chat_template(messages, tokenize=False)
    # Qwen3-Coder does not reason: a reasoning_content is not rendered.
    assert "Unclear path." not in text
    assert "<|im_start|>assistant\nWhich file?<|im_end|>\n" in text
    assert (
        "<|im_start|>assistant\nWriting it.\n\n<tool_call>\n<function=write_file>\n"
        "<parameter=path>\nf.py\n</parameter>\n"
        f"<parameter=content>\n{CODE}\n</parameter>\n"
        "<parameter=lines>\n[1, 2]\n</parameter>\n"
        '<parameter=options>\n{"backup": true}\n</parameter>\n'
        "</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>\n"
    ) in text
    assert (
        "<|im_start|>user\n<tool_response>\nsaved\n</tool_response>\n"
        "<tool_response>\nrain\n</tool_response>\n<|im_end|>\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\nSaved; rain.<|im_end|>\n<|im_start|>assistant\n")
    assert not QWEN3_CODER.opened(text[-40:])


# -- Qwen3-Coder: replies read back --------------------------------------------------------


def _coder_reply(coder: Any, content: str, *calls: dict[str, Any]) -> str:
    assistant = {"role": "assistant", "content": content, "tool_calls": list(calls)}
    return written_reply(coder, QWEN3_CODER, assistant, "<|im_end|>")


def test_coder_reads_calls_as_the_template_writes_them(coder: Any) -> None:
    names = [*NAMES, "write_file"]
    one = _coder_reply(coder, "", call("get_weather", {"city": "Paris", "days": 2}))
    assert one.startswith("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n")
    read = QWEN3_CODER.read(as_generated(coder, QWEN3_CODER, one), names=names)
    assert (read.content, read.reasoning) == (None, None)
    assert read.calls == [("get_weather", '{"city":"Paris","days":2}')]

    parallel = _coder_reply(
        coder,
        "I will save the file first.",
        call(
            "write_file",
            {"path": "a b.py", "content": CODE, "lines": [3], "options": {"backup": False}},
        ),
        call("get_time", {"zone": "UTC"}, 1),
    )
    read = QWEN3_CODER.read(as_generated(coder, QWEN3_CODER, parallel), names=names)
    assert read.content == "I will save the file first."
    assert read.calls is not None
    assert [name for name, _ in read.calls] == ["write_file", "get_time"]
    assert json.loads(read.calls[0][1]) == {
        "path": "a b.py",
        "content": CODE,
        "lines": [3],
        "options": {"backup": False},
    }
    assert read.calls[0][1] == json.dumps(
        json.loads(read.calls[0][1]), ensure_ascii=False, separators=(",", ":")
    )
    assert read.calls[1] == ("get_time", '{"zone":"UTC"}')


def test_coder_values_are_json_unless_they_are_text(coder: Any) -> None:
    def arguments(*pairs: tuple[str, str]) -> Any:
        body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in pairs)
        reply = f"<tool_call>\n<function=write_file>\n{body}</function>\n</tool_call>"
        read = QWEN3_CODER.read(as_generated(coder, QWEN3_CODER, reply), names=["write_file"])
        assert read.calls is not None and len(read.calls) == 1
        return json.loads(read.calls[0][1])

    assert arguments(("a", "3"), ("b", "true"), ("c", "null"), ("d", '{"x": [1, 2.5]}')) == {
        "a": 3,
        "b": True,
        "c": None,
        "d": {"x": [1, 2.5]},
    }
    # Text stays text, a quoted string keeps its quotes, a multi-line value keeps its lines.
    assert arguments(
        ("a", "hello world"), ("b", '"quoted"'), ("c", "NaN"), ("d", "line 1\n\nline 3")
    ) == {
        "a": "hello world",
        "b": '"quoted"',
        "c": "NaN",
        "d": "line 1\n\nline 3",
    }
    # Without the schemas, a string parameter whose text is JSON reads as that JSON
    # (documented in inference/dialects/qwen3_coder.py).
    assert arguments(("zip", "75001")) == {"zip": 75001}
    assert arguments(("empty", "")) == {"empty": ""}


def test_coder_call_cut_anywhere_keeps_what_is_written(coder: Any) -> None:
    names = [*NAMES, "write_file"]
    reply = _coder_reply(
        coder,
        "Saving.",
        call("write_file", {"path": "f.py", "content": CODE, "lines": [1, 20], "overwrite": True}),
        call("get_weather", {"city": "Paris", "days": 2}, 1),
    )
    # The template writes True as Python's `True` and JSON with blanks; the grammar writes
    # JSON's `true`, compactly.
    assert "<parameter=overwrite>\nTrue\n" in reply and "\n[1, 20]\n" in reply
    reply = reply.replace("\nTrue\n", "\ntrue\n").replace("\n[1, 20]\n", "\n[1,20]\n")
    expected = [
        (
            "write_file",
            json.dumps(
                {"path": "f.py", "content": CODE, "lines": [1, 20], "overwrite": True},
                separators=(",", ":"),
            ),
        ),
        ("get_weather", '{"city":"Paris","days":2}'),
    ]
    seen = check_cuts(coder, QWEN3_CODER, reply, calls=expected, content="Saving.", names=names)
    assert seen > 30
    decoder = TextDecoder(coder, QWEN3_CODER.markup)

    def read(text: str) -> Any:
        ids = coder.encode(text, add_special_tokens=False)
        return QWEN3_CODER.read(decoder.decode(ids), names=names).calls

    assert read("<tool_call>") == []
    assert read("<tool_call>\n<function=get_") == []  # get_weather or get_time
    assert read("<tool_call>\n<function=get_w") == [("get_weather", "")]
    assert read("<tool_call>\n<function=get_time>\n") == [("get_time", "{")]
    assert read("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar") == [
        ("get_weather", '{"city":"Par')
    ]
    assert read("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</param") == [
        ("get_weather", '{"city":"Paris')
    ]
    assert read("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n") == [
        ("get_weather", '{"city":"Paris"')
    ]
    assert read("<tool_call>\n<function=get_weather>\n<parameter=days>\n1") == [
        ("get_weather", '{"days":1')
    ]
    assert read(
        "<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>"
    ) == [("get_time", '{"zone":"CET"}')]


def test_coder_other_text_is_content(coder: Any) -> None:
    for reply in (
        "Just an answer about <function=f> tags.",
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',  # Hermes JSON
        "<tool_call>\n<function=get_time>\n</function>\n</tool_call>\nAnd after.",
        "<tool_call>\n<function=get_time>\nzone=CET\n</function>\n</tool_call>",
    ):
        text = as_generated(coder, QWEN3_CODER, reply)
        read = QWEN3_CODER.read(text, names=NAMES)
        assert (read.content, read.calls) == (text.strip(), None), reply


# -- Qwen3-Coder: grammars -----------------------------------------------------------------


def _xml(name: str, *pairs: tuple[str, str]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in pairs)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_coder_grammars_take_the_family_syntax(coder: Any) -> None:
    marks = marks_for(coder, QWEN3_CODER)

    def grammar(body: dict[str, Any]) -> str:
        found = QWEN3_CODER.grammar(body, marks=marks)
        assert found is not None
        return found

    # The template's own rendering of a call is what the grammar takes.
    one = _coder_reply(coder, "", call("get_weather", {"city": "Paris", "days": 2}))
    two = _coder_reply(
        coder,
        "",
        call("get_weather", {"city": "New York\nUSA"}),
        call("get_time", {"zone": "CET"}, 1),
    )
    required = grammar({"tools": TOOLS, "tool_choice": "required"})
    assert accepts(coder, required, one)
    assert accepts(coder, required, two)
    for reply in (
        _xml("get_weather", ("days", "2")),  # a required parameter missing
        _xml("get_weather", ("city", "Paris"), ("days", "two")),  # not an integer
        _xml("get_weather", ("city", "Paris"), ("days", "9")),  # above its maximum
        _xml("get_weather", ("days", "2"), ("city", "Paris")),  # not in the schema's order
        _xml("get_weather", ("city", "Paris"), ("wind", "yes")),  # not a parameter
        _xml("get_time", ("zone", "PST")),  # not in the enum
        _xml("get_weather", ("city", "a</parameter>b")),  # the end marker inside a value
        _xml("get_area", ("city", "Paris")),  # no such function
        "I won't call.",
    ):
        assert not accepts(coder, required, reply), reply

    single = grammar({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False})
    assert accepts(coder, single, one)
    assert not accepts(coder, single, two)

    named = grammar(
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    )
    assert accepts(coder, named, _xml("get_time", ("zone", "UTC")))
    assert not accepts(coder, named, one)

    auto = grammar({"tools": TOOLS})
    assert accepts(coder, auto, "Paris is sunny today.")
    assert accepts(coder, auto, two)
    assert accepts(coder, auto, "Let me look.\n\n" + two)  # text, then the calls
    assert not accepts(coder, auto, "Let me look.\n\n" + two + "\nDone.")

    # Every JSON type, a `$ref`, code with `<` in it, optional parameters left out.
    edit = grammar({"tools": [EDIT], "tool_choice": "required"})
    full = _xml(
        "write_file",
        ("path", "src/f.py"),
        ("content", CODE),
        ("mode", "binary"),
        ("lines", "[1,2]"),
        ("options", '{"backup":true}'),
        ("overwrite", "false"),
        ("owner", "ann"),
    )
    assert accepts(coder, edit, full)
    assert accepts(
        coder, edit, _xml("write_file", ("path", "f"), ("content", ""), ("overwrite", "true"))
    )
    for reply in (
        full.replace("binary", "octal"),
        full.replace('{"backup":true}', "{}"),
        full.replace('{"backup":true}', '{"backup": true}'),  # not compact
        full.replace("[1,2]", '["1"]'),
        full.replace("false", "False"),
        _xml("write_file", ("path", "f"), ("content", "")),  # overwrite is required
    ):
        assert not accepts(coder, edit, reply), reply
    read = QWEN3_CODER.read(as_generated(coder, QWEN3_CODER, full), names=["write_file"])
    assert read.calls is not None
    assert json.loads(read.calls[0][1]) == {
        "path": "src/f.py",
        "content": CODE,
        "mode": "binary",
        "lines": [1, 2],
        "options": {"backup": True},
        "overwrite": False,
        "owner": "ann",
    }

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    json_body = {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    assert accepts(coder, grammar(json_body), '{"n":4}')
    assert not accepts(coder, grammar(json_body), '{"n":"4"}')
    assert not accepts(coder, grammar(json_body), "<think></think>" + '{"n":4}')


def test_coder_strict_tools_require_every_parameter(coder: Any) -> None:
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    grammar = QWEN3_CODER.grammar(
        {"tools": [strict], "tool_choice": "required"}, marks=marks_for(coder, QWEN3_CODER)
    )
    assert grammar is not None
    assert accepts(coder, grammar, _xml("get_weather", ("city", "Oslo"), ("days", "3")))
    assert not accepts(coder, grammar, _xml("get_weather", ("city", "Oslo")))


def test_coder_string_keywords_hold_raw_text(coder: Any) -> None:
    word = {"type": "string", "maxLength": 8, "pattern": "^[a-z]*$"}
    tool = {
        "type": "function",
        "function": {
            "name": "find",
            "parameters": {
                "type": "object",
                "properties": {
                    "word": word,
                    "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                    "path": {"type": "string", "pattern": "/src/"},  # found anywhere
                    "note": {"type": "string", "minLength": 2, "format": "email"},
                },
                "required": ["word", "code", "path", "note"],
            },
        },
    }
    grammar = QWEN3_CODER.grammar(
        {"tools": [tool], "tool_choice": "required"}, marks=marks_for(coder, QWEN3_CODER)
    )
    assert grammar is not None

    def reply(
        word: str = "paris", code: str = "CET", path: str = "a/src/b", note: str = "hi"
    ) -> str:
        return _xml("find", ("word", word), ("code", code), ("path", path), ("note", note))

    assert accepts(coder, grammar, reply())
    assert accepts(coder, grammar, reply(word="", path="/src/"))
    for bad in (
        reply(word="Paris"),
        reply(word="abcdefghi"),  # 9 letters
        reply(code="CE"),
        reply(code="cet"),
        reply(path="a/b"),
        reply(note="x"),
        reply(note="two\nlines"),  # bounded text is written on one line
    ):
        assert not accepts(coder, grammar, bad), bad
    # `format` is an annotation: not enforced.
    read = QWEN3_CODER.read(as_generated(coder, QWEN3_CODER, reply()), names=["find"])
    assert read.calls == [("find", '{"word":"paris","code":"CET","path":"a/src/b","note":"hi"}')]


# -- DeepSeek-R1 distills -------------------------------------------------------------------

R1_FAMILIES = ("deepseek-r1-distill-qwen", "deepseek-r1-distill-llama")


def test_r1_renders_and_opens_the_reasoning() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Adding."},
        {"role": "user", "content": "3+3?"},
    ]
    assert not DEEPSEEK_R1.efforts and DEEPSEEK_R1.tools is None
    assert DEEPSEEK_R1.template_options({}) == {"enable_thinking": True}
    for name in R1_FAMILIES:
        tokenizer = load_family(name)
        text = render(tokenizer, DEEPSEEK_R1, messages)
        assert text.startswith("<｜begin▁of▁sentence｜>Be brief.<｜User｜>2+2?<｜Assistant｜>4")
        assert "Adding." not in text  # earlier reasoning is not shown again
        assert text.endswith("<｜User｜>3+3?<｜Assistant｜><think>\n")
        assert DEEPSEEK_R1.opened(text[-40:]) and not DEEPSEEK_R1.closed(text[-40:])
        # llama.cpp's copy of the Qwen distill's template closes the reasoning unless
        # enable_thinking is set (the dialect's variable); the Llama distill's always opens it.
        bare = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert bare.endswith("<think>\n</think>" if name.endswith("qwen") else "<think>\n")
        # No developer role: it comes as a system message, and these templates keep the last
        # system message only.
        developer = [{"role": "developer", "content": "Use French."}, *messages[1:]]
        text = render(tokenizer, DEEPSEEK_R1, developer)
        assert text.startswith("<｜begin▁of▁sentence｜>Use French.<｜User｜>2+2?")
        text = render(tokenizer, DEEPSEEK_R1, [*messages[:1], *developer])
        assert "Be brief." not in text and "Use French." in text


@pytest.mark.parametrize("name", R1_FAMILIES)
def test_r1_reads_reasoning_and_answer(name: str) -> None:
    tokenizer = load_family(name)
    reply = "Okay, 3 plus 3.\nThat is 6.\n</think>\n\nThe answer is **6**."
    text = as_generated(tokenizer, DEEPSEEK_R1, reply)
    read = DEEPSEEK_R1.read(text, opened=True)
    assert (read.reasoning, read.content, read.calls) == (
        "Okay, 3 plus 3.\nThat is 6.",
        "The answer is **6**.",
        None,
    )
    assert text[read.answer_at :] == "The answer is **6**."
    # Cut by max_tokens, or by a stop string, inside the reasoning: no content.
    cut = as_generated(tokenizer, DEEPSEEK_R1, "Okay, 3 plus 3.\nThat")
    assert DEEPSEEK_R1.read(cut, opened=True) == DEEPSEEK_R1.read(cut, opened=True, names=["f"])
    read = DEEPSEEK_R1.read(cut, opened=True)
    assert (read.content, read.reasoning, read.answer_at) == (
        None,
        "Okay, 3 plus 3.\nThat",
        len(cut),
    )
    stopped = text[: text.index("That")]
    assert DEEPSEEK_R1.read(stopped, opened=True).content is None
    # Every cut of the whole reply: the reasoning grows, then the answer comes.
    ids = tokenizer.encode(reply, add_special_tokens=False)
    decoder = TextDecoder(tokenizer, DEEPSEEK_R1.markup)
    for k in range(1, len(ids) + 1):
        part = DEEPSEEK_R1.read(decoder.decode(ids[:k]), opened=True)
        assert "Okay, 3 plus 3.\nThat is 6.".startswith(part.reasoning or "")
        assert part.content is None or "The answer is **6**.".startswith(part.content)


@pytest.mark.parametrize("name", R1_FAMILIES)
def test_r1_grammar_keeps_reasoning_free_then_json(name: str) -> None:
    tokenizer = load_family(name)
    marks = marks_for(tokenizer, DEEPSEEK_R1)
    assert marks.single_tokens == {"<think>", "</think>"}
    schema = {
        "type": "object",
        "properties": {"sum": {"type": "integer"}},
        "required": ["sum"],
        "additionalProperties": False,
    }
    body = {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    assert DEEPSEEK_R1.grammar({}, opened=True, marks=marks) is None  # free text
    grammar = DEEPSEEK_R1.grammar(body, opened=True, marks=marks)
    assert grammar is not None
    thought = "Okay: 3 + 3 = 6. {not json} <b>\n</think>\n\n"
    assert accepts(tokenizer, grammar, thought + '{"sum":6}')
    assert not accepts(tokenizer, grammar, thought + '{"sum":"6"}')
    assert not accepts(tokenizer, grammar, thought + '{"sum":6,"why":"math"}')
    assert not accepts(tokenizer, grammar, '{"sum":6}')  # the reasoning must close first
    read = DEEPSEEK_R1.read(
        as_generated(tokenizer, DEEPSEEK_R1, thought + '{"sum":6}'), opened=True
    )
    assert (read.reasoning, read.content) == ("Okay: 3 + 3 = 6. {not json} <b>", '{"sum":6}')
    # A prompt that closed the reasoning (the Qwen distill's template by default).
    closed = DEEPSEEK_R1.grammar(body, opened=False, marks=marks)
    assert closed is not None
    assert accepts(tokenizer, closed, '{"sum":6}')
    # No tool-call syntax: tools cannot be constrained.
    with pytest.raises(ValueError, match="no tool-call syntax"):
        DEEPSEEK_R1.grammar({"tools": TOOLS}, opened=True, marks=marks)


# -- streams ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "dialect", "reply", "opened"),
    [
        (
            "deepseek-v3.1",
            DEEPSEEK_V3,
            f"Paris first.\n</think>Let me look.{CALLS_BEGIN}"
            f'{CALL_BEGIN}get_weather{SEP}{{"city":"Paris"}}{CALL_END}{CALLS_END}',
            True,
        ),
        ("deepseek-v3.1", DEEPSEEK_V3, "Sunny, 21 degrees.", False),
        (
            "qwen3-coder",
            QWEN3_CODER,
            "Let me look.\n\n" + _xml("get_time", ("zone", "CET")),
            False,
        ),
        ("deepseek-r1-distill-llama", DEEPSEEK_R1, "Hmm, 6.\n</think>\n\nIt is 6.", True),
    ],
)
def test_streams_send_reasoning_and_content_without_markup(
    family: str, dialect: Dialect, reply: str, opened: bool
) -> None:
    tokenizer = load_family(family)
    ids = tokenizer.encode(reply, add_special_tokens=False)
    decoder = TextDecoder(tokenizer, dialect.markup)
    stream = ReplyStream(dialect, opened=opened)
    sent_reasoning, sent_content, before = "", "", ""
    for k in range(1, len(ids) + 1):
        text = decoder.decode(ids[:k])
        reasoning, content = stream.push(text[len(before) :])
        before = text
        sent_reasoning += reasoning
        sent_content += content
    read = dialect.read(before, names=NAMES, opened=opened)
    assert sent_reasoning == (read.reasoning or "")
    assert sent_content == (read.content or "")
    for marker in (*dialect.markup, "<tool_call", "<function"):
        assert marker not in sent_reasoning + sent_content
