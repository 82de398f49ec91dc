"""The shared reasoning code (`Dialect` in inference/dialects/base.py) and Hermes tool calls on
real formats: Qwen2.5 and Hermes 3 (`hermes`), Qwen3 (`qwen3`), QwQ (`qwq`), and Gemma 3 and
Phi-3.5 (`plain`), each on its real tokenizer and chat template (tests/formats).

Replies are written as the template writes an earlier assistant turn (what the model was
trained to write), tokenized by the real tokenizer and decoded as the engine decodes them
(`as_generated`); grammars run over the real tokens (llguidance). The last part holds the cases
of the former tests of `parse_tool_calls` (replies as the grammar writes them, cut at every
point), ported to `Dialect.read`.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llguidance
import pytest
from jinja2.exceptions import TemplateError
from transformers import AutoTokenizer

from inference.chat_completions import completion_body, tool_calls
from inference.dialects import DIALECTS, Dialect, Marks, call_id, detect
from inference.dialects.streams import ReplyStream
from inference.engine.decoding import TextDecoder
from inference.engine.types import (
    FINISH_LENGTH,
    FINISH_STOP,
    Choice,
    GenerationResult,
    SamplingParams,
)
from inference.rendering import text_message
from inference.structured import validate
from tests.dialects.conftest import (
    _lltokenizer,
    as_generated,
    grammar_accepts,
    load_family,
    marks_for,
)
from tests.formats.families import FAMILIES, family_dir, template_path

HERMES, QWEN3, QWQ, PLAIN = (DIALECTS[n] for n in ("hermes", "qwen3", "qwq", "plain"))

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city."},
                "unit": {"type": "string", "enum": ["c", "f"], "description": "The unit."},
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
        "description": "The time in a zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "description": "The zone."}},
            "required": ["zone"],
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

USER = {"role": "user", "content": "What is the weather in Paris, and the time in CET?"}
PARIS_ARGS = {"city": "Paris", "unit": "c"}
CET_ARGS = {"zone": "CET"}
PARIS = ("get_weather", '{"city":"Paris","unit":"c"}')
CET = ("get_time", '{"zone":"CET"}')
# As the templates write the arguments (tojson): blanks after the separators.
PARIS_WRITTEN = '{"city": "Paris", "unit": "c"}'
MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>")

# The bug of the issue: Qwen3's real reply must read back as reasoning and content.
ISSUE_REPLY = "<think>\nThe user asks 2+2. That is 4.\n</think>\n\n2+2 equals 4."
REASONING = "The user asks for the weather and the time. I will call both tools."


def call(name: str, arguments: dict[str, Any], index: int = 1) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": f"call_{index}", "type": "function", "function": function}


def assistant(content: str | None, *calls: dict[str, Any], reasoning: str | None = None) -> Any:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


WEATHER_CALL = call("get_weather", PARIS_ARGS, 1)
TIME_CALL = call("get_time", CET_ARGS, 2)


@dataclass(frozen=True)
class Family:
    """A family with tool calls: its dialect, and whether its prompt opens the reasoning."""

    name: str
    dialect: Dialect
    opened: bool = False

    @property
    def tokenizer(self) -> Any:
        return load_family(self.name)

    @property
    def thinks(self) -> bool:
        return self.dialect.thinking is not None


CALLING = {
    f.name: f
    for f in (
        Family("qwen2.5", HERMES),
        Family("hermes3", HERMES),
        Family("qwen3", QWEN3),
        Family("qwq", QWQ, opened=True),
    )
}


@pytest.fixture(params=list(CALLING))
def family(request: pytest.FixtureRequest) -> Family:
    return CALLING[request.param]


def render(
    tok: Any,
    dialect: Dialect,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    generation: bool = True,
) -> str:
    """The prompt as Boardwalk renders it (inference/rendering.py), as text."""
    shown = dialect.template_messages([text_message(m) for m in messages])
    text = tok.apply_chat_template(
        shown,
        tools=tools or None,
        add_generation_prompt=generation,
        tokenize=False,
        **dialect.template_options(body or {}),
    )
    return str(text)


def needs_tools(name: str) -> list[dict[str, Any]] | None:
    return TOOLS if FAMILIES[name].needs_tools else None


def template_turn(family: Family, message: dict[str, Any]) -> str:
    """An assistant turn as the family's template writes it (after `<|im_start|>assistant\\n`,
    before `<|im_end|>`): what the model writes."""
    rendered = render(
        family.tokenizer, family.dialect, [USER, message], tools=TOOLS, generation=False
    )
    head = "<|im_start|>assistant"
    turn = rendered[rendered.rindex(head) + len(head) : rendered.rindex("<|im_end|>")]
    assert turn.startswith("\n"), turn
    return turn[1:]


def model_reply(family: Family, message: dict[str, Any], reasoning: str = REASONING) -> str:
    """The reply the family's model writes for `message`, reasoning first where it thinks:
    Qwen3's template writes it; QwQ's prompt opens it, so its reply begins inside it."""
    if family.dialect is QWEN3:
        return template_turn(family, {**message, "reasoning_content": reasoning})
    if family.dialect is QWQ:
        return reasoning + "\n</think>\n\n" + template_turn(family, message)
    return template_turn(family, message)


def read(family: Family, reply: str, names: tuple[str, ...] = NAMES) -> Any:
    text = as_generated(family.tokenizer, family.dialect, reply)
    return family.dialect.read(text, names=names, opened=family.opened)


def prefixes(tok: Any, dialect: Dialect, reply: str) -> list[str]:
    """The reply's text after each of its tokens, as the engine streams it (a trailing
    incomplete character held back)."""
    ids = tok.encode(reply, add_special_tokens=False)
    decoder = TextDecoder(tok, dialect.markup)
    return [decoder.decode(ids[:k]).rstrip("\ufffd") for k in range(1, len(ids) + 1)]


# -- the families' markup in their vocabularies ----------------------------------------------


@pytest.mark.parametrize("name", ["qwen2.5", "qwen3", "qwq"])
def test_qwen_markers_are_single_tokens_the_grammar_writes_as_tokens(name: str) -> None:
    family = CALLING[name]
    tok, dialect = family.tokenizer, family.dialect
    vocab = tok.get_vocab()
    assert HERMES.markup == ("<tool_call>", "</tool_call>")
    for marker in ("<tool_call>", "</tool_call>", *(("<think>", "</think>") * family.thinks)):
        assert marker in dialect.markers and marker in vocab
        assert marks_for(tok, dialect)(marker) == marker  # a token reference, not text
    # Qwen2.5's vocabulary predates the reasoning markers.
    assert ("<think>" in vocab) == (name != "qwen2.5")


def test_hermes3_markers_are_text_in_llama_3_1s_vocabulary() -> None:
    tok = CALLING["hermes3"].tokenizer
    marks = marks_for(tok, HERMES)
    for marker in ("<tool_call>", "</tool_call>"):
        assert len(tok.encode(marker, add_special_tokens=False)) > 1
        assert marks(marker) == json.dumps(marker)


def test_a_reply_ends_at_the_token_each_template_ends_a_turn_with() -> None:
    """The template's end of an assistant turn is one of the family's end-of-sequence ids or
    a turn end of its dialect (Hermes 3 aside: see below)."""
    ends = {
        "qwen2.5": (HERMES, "<|im_end|>"),
        "qwen3": (QWEN3, "<|im_end|>"),
        "qwq": (QWQ, "<|im_end|>"),
        "gemma3": (PLAIN, "<end_of_turn>"),
        "phi3.5": (PLAIN, "<|end|>"),
    }
    for name, (dialect, end) in ends.items():
        tok = load_family(name)
        rendered = render(
            tok,
            dialect,
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
            generation=False,
        )
        assert "Hello" + end in rendered, name
        eos = json.loads((family_dir(name) / "generation_config.json").read_text())
        (end_id,) = tok.encode(end, add_special_tokens=False)
        turn_ends = {tok.get_vocab()[t] for t in dialect.turn_ends if t in tok.get_vocab()}
        assert end_id in set(eos["eos_token_id"]) | turn_ends, name
    # Hermes 3 read with Llama 3.1's tokenizer: its template's <|im_end|> is text there, so
    # only the real Hermes 3 vocabulary (where it is one token) ends a turn with it.
    assert len(load_family("hermes3").encode("<|im_end|>", add_special_tokens=False)) > 1
    assert HERMES.turn_ends == ("<|im_end|>",)


# -- detect -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "dialect"),
    [
        ("qwen2.5", "hermes"),
        ("hermes3", "hermes"),
        ("qwen3", "qwen3"),
        ("qwq", "qwq"),
        ("gemma3", "plain"),
        ("phi3.5", "plain"),
    ],
)
def test_detect_picks_the_dialect_of_each_real_template(name: str, dialect: str) -> None:
    assert detect(load_family(name).chat_template).name == dialect


def test_detect_picks_none_of_these_dialects_for_the_other_families() -> None:
    mine = {"hermes", "qwen3", "qwq"}
    for name, family in FAMILIES.items():
        if name in CALLING or family.template is None:
            continue
        template = template_path(family.template).read_text(encoding="utf-8")
        assert detect(template).name not in mine, name
    hermes2 = template_path("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja")
    assert detect(hermes2.read_text(encoding="utf-8")) is HERMES


# -- rendering ----------------------------------------------------------------------------------

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "developer", "content": "Answer in French."},
    USER,
    assistant(None, WEATHER_CALL, TIME_CALL, reasoning="I need both tools."),
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "content": '{"time": "10:00"}'},
]


def test_a_tool_conversation_renders_in_the_familys_syntax(family: Family) -> None:
    tok, dialect = family.tokenizer, family.dialect
    rendered = render(tok, dialect, CONVERSATION, tools=TOOLS)
    assert rendered.startswith("<|begin_of_text|><|im_start|>system\n" * (family.name == "hermes3"))
    assert "You are terse." in rendered
    # No template of these families knows a developer role: the message comes as a system one.
    assert "<|im_start|>system\nAnswer in French.<|im_end|>" in rendered
    shown = [text_message(m) for m in CONVERSATION]
    raw = tok.apply_chat_template(shown, tools=TOOLS, tokenize=False)
    assert "Answer in French." not in raw  # the template alone would drop it
    assert "<|im_start|>user\n" + USER["content"] + "<|im_end|>" in rendered
    assert '"name": "get_weather"' in rendered  # the tools are declared
    for name, arguments in (("get_weather", PARIS_ARGS), ("get_time", CET_ARGS)):
        written = json.dumps({"name": name, "arguments": arguments})
        assert f"<tool_call>\n{written}\n</tool_call>" in rendered
    role = "tool" if family.name == "hermes3" else "user"
    assert f"<|im_start|>{role}\n<tool_response>\n" in rendered
    assert '<tool_response>\n{"temp": 21}\n</tool_response>' in rendered
    # The reasoning of the turn that called, in this tool loop: Qwen3's template shows it.
    assert ("<think>\nI need both tools.\n</think>" in rendered) == (dialect is QWEN3)
    assert "I need both tools." in rendered if dialect is QWEN3 else "need both" not in rendered
    ending = "<|im_start|>assistant\n" + "<think>\n" * (dialect is QWQ)
    assert rendered.endswith(ending)


def test_the_reasoning_of_an_answered_turn_is_not_rendered(family: Family) -> None:
    messages = [
        USER,
        assistant("It is 21 degrees.", reasoning="Paris is mild."),
        {"role": "user", "content": "Thanks!"},
    ]
    rendered = render(family.tokenizer, family.dialect, messages, tools=TOOLS)
    assert "It is 21 degrees." in rendered and "Paris is mild." not in rendered


@pytest.mark.parametrize("effort", ["none", "minimal", "low", "medium", "high", "xhigh"])
def test_reasoning_effort_switches_qwen3s_thinking(effort: str) -> None:
    tok = load_family("qwen3")
    body = {"reasoning_effort": effort}
    thinking = effort not in ("none", "minimal")
    assert QWEN3.template_options(body) == {"enable_thinking": thinking}
    rendered = render(tok, QWEN3, [USER], body=body)
    closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert rendered.endswith(closed) != thinking
    if thinking:
        assert rendered.endswith("<|im_start|>assistant\n")
    ids = tok.encode(rendered, add_special_tokens=False)
    # As the engine decides it (inference/chat_completions.py): the reply never begins inside
    # the reasoning; with thinking off the prompt closed it.
    tail = tok.decode(ids[-8:], skip_special_tokens=False)
    assert not QWEN3.opened(tail)
    assert QWEN3.closed(tail) != thinking


def test_qwq_always_thinks_and_takes_no_reasoning_effort() -> None:
    tok = load_family("qwq")
    assert QWQ.efforts == {}  # reasoning_effort is refused
    rendered = render(tok, QWQ, [USER])
    assert rendered.endswith("<|im_start|>assistant\n<think>\n")
    ids = tok.encode(rendered, add_special_tokens=False)
    assert QWQ.opened(tok.decode(ids[-8:], skip_special_tokens=False))
    # llama.cpp's copy of the template closes the reasoning without enable_thinking.
    assert "enable_thinking" in tok.chat_template
    bare = tok.apply_chat_template([USER], add_generation_prompt=True, tokenize=False)
    assert bare.endswith("<think>\n</think>")


def test_qwqs_release_template_is_qwq_and_opens_the_reasoning() -> None:
    """The release's template (llama.cpp's copy less its enable_thinking line) always opens
    the reasoning, and ignores the variable Boardwalk sets for llama.cpp's copy."""
    tok = load_family("qwq")
    release, count = re.subn(r"\s*\{%- if not enable_thinking -%\}.*?\{%- endif -%\}", "",
                             tok.chat_template)  # fmt: skip
    assert count == 1 and "enable_thinking" not in release
    assert detect(release) is QWQ
    shown = QWQ.template_messages([text_message(USER)])
    for options in ({}, QWQ.template_options({})):
        text = tok.apply_chat_template(
            shown, add_generation_prompt=True, tokenize=False, chat_template=release, **options
        )
        assert text.endswith("<|im_start|>assistant\n<think>\n")


def test_qwen2_5_and_hermes3_take_no_reasoning_effort() -> None:
    assert HERMES.efforts == {} and HERMES.thinking is None
    assert HERMES.template_options({"reasoning_effort": "high"}) == {}


@pytest.mark.parametrize("name", ["gemma3", "phi3.5"])
def test_plain_templates_render_system_developer_user_and_assistant(name: str) -> None:
    tok = load_family(name)
    if name == "gemma3":  # one system message, first (folded into the first user turn)
        messages = [
            {"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": "Hi"},
            assistant("Bonjour", reasoning="A greeting."),
            {"role": "user", "content": "Again"},
        ]
        expected = [
            "<start_of_turn>user\nAnswer in French.\n\nHi<end_of_turn>",
            "<start_of_turn>model\nBonjour<end_of_turn>",
            "<start_of_turn>user\nAgain<end_of_turn>",
        ]
        ending = "<start_of_turn>model\n"
    else:
        messages = [
            {"role": "system", "content": "You are terse."},
            {"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": "Hi"},
            assistant("Bonjour", reasoning="A greeting."),
            {"role": "user", "content": "Again"},
        ]
        expected = [
            "<|system|>\nYou are terse.<|end|>",
            "<|system|>\nAnswer in French.<|end|>",
            "<|user|>\nHi<|end|>",
            "<|assistant|>\nBonjour<|end|>",
        ]
        ending = "<|assistant|>\n"
    rendered = render(tok, PLAIN, messages)
    for piece in expected:
        assert piece in rendered, piece
    assert "A greeting." not in rendered and rendered.endswith(ending)
    # The template alone drops the developer message (Phi-3.5) or refuses it (Gemma 3).
    if name == "phi3.5":
        raw = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert "Answer in French." not in raw
    else:
        with pytest.raises(TemplateError, match="must alternate"):
            tok.apply_chat_template(messages, tokenize=False)
    assert PLAIN.efforts == {} and PLAIN.tools is None and PLAIN.thinking is None


# -- reading replies back -----------------------------------------------------------------------


@pytest.mark.parametrize("family_name", ["qwen3", "qwq"])
def test_the_issue_reply_reads_back_as_reasoning_and_content(family_name: str) -> None:
    family = CALLING[family_name]
    reply = ISSUE_REPLY if family.dialect is QWEN3 else ISSUE_REPLY.removeprefix("<think>\n")
    for names in ((), NAMES):
        got = read(family, reply, names)
        assert got.reasoning == "The user asks 2+2. That is 4."
        assert got.content == "2+2 equals 4."
        assert got.calls is None


def test_a_tokenizer_that_marks_think_special_still_reads_the_reasoning(tmp_path: Path) -> None:
    """The reasoning markers are markup: a checkpoint whose tokenizer marks them special
    (so that skipping special tokens drops them) reads back the same."""
    for source in family_dir("qwen3").iterdir():
        shutil.copy(source, tmp_path / source.name)
    tokenizer = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    for token in tokenizer["added_tokens"]:
        token["special"] = token["special"] or token["content"] in ("<think>", "</think>")
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    for token in config["added_tokens_decoder"].values():
        token["special"] = token["special"] or token["content"] in ("<think>", "</think>")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    assert tok.added_tokens_decoder[tok.get_vocab()["<think>"]].special
    ids = tok.encode(ISSUE_REPLY, add_special_tokens=False)
    dropped = TextDecoder(tok).decode(ids)  # what a decoder without the markup reads
    assert "<think>" not in dropped and "The user asks" in QWEN3.read(dropped).content
    got = QWEN3.read(as_generated(tok, QWEN3, ISSUE_REPLY))
    assert (got.reasoning, got.content) == ("The user asks 2+2. That is 4.", "2+2 equals 4.")


def test_an_answer_reads_back_as_content(family: Family) -> None:
    got = read(family, model_reply(family, assistant("It is 21 degrees in Paris.")))
    assert got.content == "It is 21 degrees in Paris."
    assert got.reasoning == (REASONING if family.thinks else None)
    assert got.calls is None


def test_qwen3_with_thinking_off_answers_straight_away() -> None:
    family = CALLING["qwen3"]
    got = read(family, "It is 21 degrees in Paris.")
    assert (got.reasoning, got.content, got.calls) == (None, "It is 21 degrees in Paris.", None)
    got = read(family, '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n'
                       "</tool_call>")  # fmt: skip
    assert (got.reasoning, got.content, got.calls) == (None, None, [CET])


def test_one_call_reads_back_as_a_tool_call(family: Family) -> None:
    reply = model_reply(family, assistant(None, WEATHER_CALL))
    assert "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": PARIS_ARGS}) in reply
    got = read(family, reply)
    assert got.content is None
    assert got.calls == [PARIS]
    assert got.reasoning == (REASONING if family.thinks else None)


def test_parallel_calls_read_back_in_order(family: Family) -> None:
    got = read(family, model_reply(family, assistant(None, WEATHER_CALL, TIME_CALL)))
    assert (got.content, got.calls) == (None, [PARIS, CET])


def test_text_before_a_call_is_content(family: Family) -> None:
    message = assistant("Let me look that up.", WEATHER_CALL)
    if family.name == "hermes3":  # its template leaves a calling turn's text out
        reply = "Let me look that up.\n" + template_turn(family, message)
    else:
        reply = model_reply(family, message)
    assert "Let me look that up.\n<tool_call>\n" in reply
    got = read(family, reply)
    assert (got.content, got.calls) == ("Let me look that up.", [PARIS])


def test_a_call_to_an_unknown_tool_under_tool_choice_none_stays_text(family: Family) -> None:
    reply = model_reply(family, assistant(None, WEATHER_CALL))
    got = read(family, reply, names=())  # no tools offered, or tool_choice "none"
    assert got.calls is None and got.content is not None
    assert got.content.startswith("<tool_call>")


def test_a_call_cut_by_max_tokens_keeps_its_arguments_so_far(family: Family) -> None:
    tok, dialect = family.tokenizer, family.dialect
    reply = model_reply(family, assistant(None, WEATHER_CALL))
    seen: set[str] = set()
    for text in prefixes(tok, dialect, reply):
        got = dialect.read(text, names=NAMES, opened=family.opened)
        answer = text[got.answer_at :] if got.answer_at < len(text) else ""
        if not answer.strip():  # still inside the reasoning, or right after it
            assert got.calls is None and not got.content
            continue
        assert got.content is None, text  # never the call's markup as text
        assert got.calls is not None and len(got.calls) <= 1, text
        if got.calls:
            name, arguments = got.calls[0]
            assert name == "get_weather"
            assert arguments == PARIS[1] or PARIS_WRITTEN.startswith(arguments), text
            seen.add(arguments)
    assert "" in seen and PARIS[1] in seen  # the name known before the arguments; them whole
    partial = [a for a in seen if a and a != PARIS[1]]
    assert partial and all(PARIS_WRITTEN.startswith(a) for a in partial)  # cut inside them


def test_a_cut_name_is_known_once_only_one_function_begins_so(family: Family) -> None:
    reply = model_reply(family, assistant(None, TIME_CALL))
    cut = reply[: reply.index('"get_t') + len('"get_')]
    assert read(family, cut).calls == []  # get_weather or get_time
    assert read(family, cut + "t").calls == [("get_time", "")]
    assert read(family, cut, names=("get_time",)).calls == [("get_time", "")]


def test_calls_before_the_cut_are_kept(family: Family) -> None:
    reply = model_reply(family, assistant(None, WEATHER_CALL, TIME_CALL))
    cut = reply[: reply.index('"zone": "C') + len('"zone": "C')]
    assert read(family, cut).calls == [PARIS, ("get_time", '{"zone": "C')]


@pytest.mark.parametrize("family_name", ["qwen3", "qwq"])
def test_reasoning_cut_by_max_tokens_has_no_content(family_name: str) -> None:
    family = CALLING[family_name]
    reply = model_reply(family, assistant(None, WEATHER_CALL))
    cut = reply[: reply.index("I will call")]
    got = read(family, cut)
    assert got.content is None and got.calls is None
    assert got.reasoning == "The user asks for the weather and the time."
    # A cut right after the closing marker: the reasoning whole, no answer yet.
    closed = reply[: reply.index("</think>") + len("</think>")]
    got = read(family, closed)
    assert got.reasoning == REASONING and not got.content and not got.calls


@pytest.mark.parametrize("family_name", ["qwen3", "qwq"])
def test_a_stop_string_inside_the_reasoning(family_name: str) -> None:
    """The engine cuts the text before the stop string: the reply ends inside its reasoning."""
    family = CALLING[family_name]
    reply = model_reply(family, assistant("It is 21 degrees."))
    text = as_generated(family.tokenizer, family.dialect, reply)
    cut = text[: text.index(" I will")]  # stop: [" I will"]
    got = family.dialect.read(cut, names=NAMES, opened=family.opened)
    assert (got.reasoning, got.content, got.calls) == (
        "The user asks for the weather and the time.",
        None,
        None,
    )
    assert got.answer_at == len(cut)  # every token of it is reasoning


@pytest.mark.parametrize("family_name", ["qwen3", "qwq"])
def test_the_answer_begins_after_the_reasoning_and_its_markup(family_name: str) -> None:
    family = CALLING[family_name]
    text = as_generated(family.tokenizer, family.dialect, model_reply(family, assistant("Yes.")))
    got = family.dialect.read(text, opened=family.opened)
    assert text[got.answer_at :] == "Yes."


def test_plain_replies_are_text_whatever_they_hold() -> None:
    for name in ("gemma3", "phi3.5"):
        tok = load_family(name)
        reply = "<think>\nHmm.\n</think>\n\nSure: <tool_call>\n{}\n</tool_call>"
        text = as_generated(tok, PLAIN, reply)
        got = PLAIN.read(text, names=NAMES)
        assert (got.reasoning, got.calls, got.content) == (None, None, text)
        assert text == reply
        assert PLAIN.markup == () and PLAIN.stream_view(text) == ("", text)


# -- streaming ----------------------------------------------------------------------------------


def test_without_tools_the_answer_streams_as_it_comes() -> None:
    """A request without tools reads no calls, so nothing that looks like call markup is held
    back, nor are trailing blanks: each piece goes out as the engine yields it."""
    hermes = DIALECTS["hermes"]
    stream = ReplyStream(hermes, calls=False)
    pieces = ["ok", " ok", " ", "<tool_", "call>"]
    assert [stream.push(p) for p in pieces] == [("", p) for p in pieces]
    assert hermes.read("".join(pieces)).content == "".join(pieces)
    with_tools = ReplyStream(hermes)  # with tools the blank and the trigger wait
    assert [with_tools.push(p)[1] for p in pieces] == ["ok", " ok", "", "", ""]


def stream_cases(family: Family) -> list[str]:
    cases = [
        model_reply(family, assistant("It is 21 degrees in Paris.")),
        model_reply(family, assistant(None, WEATHER_CALL, TIME_CALL)),
        model_reply(family, assistant("Prix: 3 < 4 € — “ok” 🙂 日本語.")),
    ]
    if family.name != "hermes3":
        cases.append(model_reply(family, assistant("Let me look that up.", WEATHER_CALL)))
    if family.dialect is QWEN3:
        cases.append(ISSUE_REPLY)
        cases.append("Straight away, <b>bold</b> <tool words.")  # thinking off
    return cases


def test_stream_views_extend_each_other_and_end_as_read(family: Family) -> None:
    tok, dialect = family.tokenizer, family.dialect
    for reply in stream_cases(family):
        final = dialect.read(as_generated(tok, dialect, reply), names=NAMES, opened=family.opened)
        end = (final.reasoning or "", final.content or "")
        shown = ("", "")
        stream = ReplyStream(dialect, opened=family.opened)
        sent = ["", ""]
        streamed = ""
        for text in prefixes(tok, dialect, reply):
            view = dialect.stream_view(text, opened=family.opened)
            for part, before, last in zip(view, shown, end, strict=True):
                assert part.startswith(before), (reply, text, view)
                assert last.startswith(part), (reply, text, view)  # never taken back
                assert not any(marker in part for marker in MARKERS), (reply, text)
            shown = view
            reasoning, content = stream.push(text[len(streamed) :])
            streamed = text
            sent[0] += reasoning
            sent[1] += content
        assert shown == end, reply
        assert tuple(sent) == end, reply


# -- grammars -----------------------------------------------------------------------------------


def compact_call(name: str, arguments: dict[str, Any]) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))
    return f"<tool_call>\n{body}\n</tool_call>"


GRAMMAR_PARIS = compact_call("get_weather", PARIS_ARGS)
GRAMMAR_CET = compact_call("get_time", CET_ARGS)


def thought(family: Family) -> str:
    """The reasoning a thinking family's reply begins with, as the grammar lets it write it."""
    if family.dialect is QWEN3:
        return "<think>\nLet me see.\n</think>\n\n"
    if family.dialect is QWQ:
        return "Let me see.\n</think>\n\n"
    return ""


def grammar_of(family: Family, body: dict[str, Any]) -> str:
    grammar = family.dialect.grammar(
        body, opened=family.opened, marks=marks_for(family.tokenizer, family.dialect)
    )
    assert grammar is not None
    validate(grammar)
    return grammar


def accepts(family: Family, grammar: str, answer: str) -> bool:
    return grammar_accepts(family.tokenizer, grammar, thought(family) + answer)


def test_required_holds_the_reply_to_calls(family: Family) -> None:
    grammar = grammar_of(family, {"tools": TOOLS, "tool_choice": "required"})
    assert accepts(family, grammar, GRAMMAR_PARIS)
    assert accepts(family, grammar, GRAMMAR_PARIS + "\n" + GRAMMAR_CET)
    assert not accepts(family, grammar, "It is 21 degrees.")
    assert not accepts(family, grammar, "Sure.\n" + GRAMMAR_PARIS)
    broken = compact_call("get_weather", {"city": 75})  # the schema wants a string
    assert not accepts(family, grammar, broken)
    assert not accepts(family, grammar, compact_call("get_weather", {"city": "Paris", "x": 1}))
    assert not accepts(family, grammar, compact_call("get_news", {}))
    # The grammar's calls read back as the calls written.
    text = as_generated(family.tokenizer, family.dialect, thought(family) + GRAMMAR_PARIS)
    assert family.dialect.read(text, names=NAMES, opened=family.opened).calls == [PARIS]


def test_the_grammar_writes_qwen_markers_as_their_tokens(family: Family) -> None:
    grammar = grammar_of(family, {"tools": TOOLS, "tool_choice": "required"})
    as_tokens = family.name != "hermes3"
    assert ("call: <tool_call> " in grammar) == as_tokens
    assert (" </tool_call>" in grammar and '"</tool_call>"' not in grammar) == as_tokens


def test_a_named_function_holds_the_reply_to_one_call_to_it(family: Family) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    grammar = grammar_of(family, {"tools": TOOLS, "tool_choice": named})
    assert accepts(family, grammar, GRAMMAR_CET)
    assert not accepts(family, grammar, GRAMMAR_PARIS)
    assert not accepts(family, grammar, GRAMMAR_CET + "\n" + GRAMMAR_CET)


@pytest.mark.parametrize("parallel", [True, False, None])
def test_auto_allows_text_calls_and_text_before_calls(family: Family, parallel: Any) -> None:
    body: dict[str, Any] = {"tools": TOOLS}
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    grammar = grammar_of(family, body)
    assert accepts(family, grammar, "It is 21 degrees.")
    assert accepts(family, grammar, "<b>Bold</b> 3 < 4.")
    assert accepts(family, grammar, GRAMMAR_PARIS)
    assert accepts(family, grammar, "Let me look that up.\n" + GRAMMAR_PARIS)
    assert accepts(family, grammar, GRAMMAR_PARIS + "\n" + GRAMMAR_CET) == (parallel is not False)
    assert not accepts(family, grammar, "Sure.\n" + compact_call("get_weather", {"city": 75}))
    assert not accepts(family, grammar, "Sure: <tool_call>\nnot a call\n</tool_call>")
    assert not accepts(family, grammar, GRAMMAR_PARIS + "\nDone.")


def test_json_schema_holds_the_answer(family: Family) -> None:
    grammar = grammar_of(family, {"response_format": JSON_FORMAT})
    assert accepts(family, grammar, '{"answer":4}')
    assert not accepts(family, grammar, '{"answer":"four"}')
    assert not accepts(family, grammar, "4")
    both = grammar_of(family, {"response_format": JSON_FORMAT, "tools": TOOLS})
    assert accepts(family, both, '{"answer":4}') and accepts(family, both, GRAMMAR_PARIS)
    assert not accepts(family, both, '{"answer":"four"}')


def test_qwen3_may_answer_without_reasoning_under_a_grammar() -> None:
    family = CALLING["qwen3"]
    grammar = grammar_of(family, {"tools": TOOLS, "tool_choice": "required"})
    assert grammar_accepts(family.tokenizer, grammar, GRAMMAR_PARIS)
    closed = QWEN3.grammar(
        {"tools": TOOLS, "tool_choice": "required"},
        marks=marks_for(family.tokenizer, QWEN3),
        closed=True,
    )
    assert closed is not None
    assert grammar_accepts(family.tokenizer, closed, GRAMMAR_PARIS)
    assert not grammar_accepts(family.tokenizer, closed, thought(family) + GRAMMAR_PARIS)


def test_qwqs_grammar_begins_inside_the_reasoning() -> None:
    family = CALLING["qwq"]
    grammar = grammar_of(family, {"response_format": JSON_FORMAT})
    assert grammar_accepts(family.tokenizer, grammar, 'Hmm.\n</think>\n\n{"answer":4}')
    assert not grammar_accepts(family.tokenizer, grammar, '<think>\nHmm.\n</think>\n{"answer":4}')
    assert not grammar_accepts(family.tokenizer, grammar, '{"answer":4}')


def test_no_grammar_for_free_text(family: Family) -> None:
    marks = marks_for(family.tokenizer, family.dialect)
    assert family.dialect.grammar({}, marks=marks) is None
    assert family.dialect.grammar({"tools": TOOLS, "tool_choice": "none"}, marks=marks) is None


def accepts_after(tok: Any, grammar: str, tail: str, reply: str) -> bool:
    """Whether the grammar takes the tokens of `reply` as the tokenizer writes it after the
    prompt's `tail`."""
    before = tok.encode(tail, add_special_tokens=False)
    ids = tok.encode(tail + reply, add_special_tokens=False)
    assert ids[: len(before)] == before
    matcher = llguidance.LLMatcher(_lltokenizer(tok), grammar, log_level=0)
    return all(matcher.consume_token(i) for i in ids[len(before) :]) and matcher.is_accepting()


@pytest.mark.parametrize("name", ["phi3.5", "gemma3"])
def test_plain_holds_json_answers_and_has_no_tool_calls(name: str) -> None:
    tok = load_family(name)
    grammar = PLAIN.grammar({"response_format": JSON_FORMAT}, marks=marks_for(tok, PLAIN))
    assert grammar is not None
    validate(grammar)
    # After the prompt's last token (alone, Phi-3.5's tokenizer begins a text with a blank).
    tail = {"phi3.5": "<|assistant|>\n", "gemma3": "<start_of_turn>model\n"}[name]
    assert accepts_after(tok, grammar, tail, '{"answer":4}')
    assert not accepts_after(tok, grammar, tail, '{"answer":"four"}')
    assert not accepts_after(tok, grammar, tail, "The answer is 4.")
    with pytest.raises(ValueError, match="no tool-call syntax"):
        PLAIN.grammar({"tools": TOOLS}, marks=Marks())


# -- Hermes calls as the grammar writes them (the former parse_tool_calls cases) ----------------

WEATHER_ARGS = '{"city":"Paris ","unit":"c"}'  # a trailing blank inside a string, on purpose
LOOKUP_ARGS = '{"id":4}'
OLD_NAMES = ("get_weather", "get_time", "lookup")
OLD_WEATHER = f'<tool_call>\n{{"name":"get_weather","arguments":{WEATHER_ARGS}}}\n</tool_call>'
OLD_LOOKUP = f'<tool_call>\n{{"name":"lookup","arguments":{LOOKUP_ARGS}}}\n</tool_call>'
TWO_CALLS = OLD_WEATHER + "\n" + OLD_LOOKUP
OPEN_WEATHER = '<tool_call>\n{"name":"get_weather","arguments":'


def calls_of(text: str, names: tuple[str, ...] = OLD_NAMES) -> list[tuple[str, str]] | None:
    reply = HERMES.read(text, names=names)
    if reply.calls is not None:
        assert reply.content is None  # none of these write text before the calls
    return reply.calls


def test_complete_calls_come_back_whole_with_the_arguments_compact() -> None:
    assert calls_of(TWO_CALLS) == [("get_weather", WEATHER_ARGS), ("lookup", LOOKUP_ARGS)]
    spaced = '<tool_call>\n{"name": "lookup", "arguments": {"id": 4}}\n</tool_call>'
    assert calls_of(spaced) == [("lookup", LOOKUP_ARGS)]
    assert calls_of('<tool_call>{"name":"lookup","arguments":{"k":"é"}}</tool_call>') == [
        ("lookup", '{"k":"é"}')
    ]


def test_ids_are_distinct_and_derived_from_the_seed() -> None:
    ids = [call_id("chatcmpl-1:0", i) for i in range(2)]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)
    assert ids == [call_id("chatcmpl-1:0", i) for i in range(2)]
    assert not set(ids) & {call_id("chatcmpl-2:0", i) for i in range(2)}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # In the opening tag, or before the name: unknown among several names.
        ("<", []),
        ("<tool_call>\n", []),
        ('<tool_call>\n{"na', []),
        ('<tool_call>\n{"name":"', []),
        ('<tool_call>\n{ "name" : "', []),
        # In the name: known once one name alone begins with what was written.
        ('<tool_call>\n{"name":"get_', []),
        ('<tool_call>\n{"name":"get_w', [("get_weather", "")]),
        ('<tool_call>\n{"name":"lookup', [("lookup", "")]),
        # After the name: the arguments written so far, a string that is not JSON yet.
        ('<tool_call>\n{"name":"lookup"', [("lookup", "")]),
        ('<tool_call>\n{"name":"lookup","argu', [("lookup", "")]),
        ('<tool_call>\n{"name": "lookup", "argu', [("lookup", "")]),
        ('<tool_call>\n{"name":"lookup","arguments":', [("lookup", "")]),
        ('<tool_call>\n{"name":"lookup","arguments":{', [("lookup", "{")]),
        ('<tool_call>\n{"name": "lookup", "arguments": {"i', [("lookup", '{"i')]),
        (f'{OPEN_WEATHER}{{"city":"Par', [("get_weather", '{"city":"Par')]),
        (f'{OPEN_WEATHER}{{"city":"Paris ', [("get_weather", '{"city":"Paris ')]),
        # The arguments whole, the call's JSON or its closing tag not.
        ('<tool_call>\n{"name":"lookup","arguments":{"id":4}', [("lookup", LOOKUP_ARGS)]),
        ('<tool_call>\n{"name": "lookup", "arguments": {"id": 4}', [("lookup", LOOKUP_ARGS)]),
        ('<tool_call>\n{"name":"lookup","arguments":{"id":4}}', [("lookup", LOOKUP_ARGS)]),
        ('<tool_call>\n{"name":"lookup","arguments":{"id":4}}\n</tool_', [("lookup", LOOKUP_ARGS)]),
    ],
)  # fmt: skip
def test_a_cut_call_comes_back_as_a_call_never_as_markup(
    text: str, expected: list[tuple[str, str]]
) -> None:
    assert calls_of(text) == expected


def test_one_allowed_name_is_known_from_the_first_byte() -> None:
    # A named tool_choice (or a single tool): the grammar allows that function alone.
    assert calls_of("<", names=("lookup",)) == [("lookup", "")]
    assert calls_of('<tool_call>\n{"name":"lo', names=("lookup",)) == [("lookup", "")]


def test_complete_calls_before_the_cut_are_kept() -> None:
    first = OLD_WEATHER
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


def test_every_cut_of_two_calls_is_calls_whose_arguments_prefix_the_whole_ones() -> None:
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
def test_output_that_is_not_tool_calls_is_text(text: str) -> None:
    reply = HERMES.read(text, names=OLD_NAMES)
    assert reply.calls is None and reply.content == text


@pytest.mark.parametrize(
    "text",
    [
        "<b>bold</b>",
        '<tool_call>\n{"name":"lookup","arguments":{"id":4}}\n</tool_call> and text',
        '<tool_call>\n{"name":"lookup","arguments":{"id":4}}\nnot a tag',
        '<tool_call>\n["not", "a", "call"]\n</tool_call>',
        '<tool_call>\n{"arguments":{"id":4}',
        "<tool_call>\n[",
    ],
)
def test_output_the_grammar_could_not_have_written_is_not_read_as_calls(text: str) -> None:
    reply = HERMES.read(text, names=OLD_NAMES)
    assert reply.calls is None and reply.content == text


# -- the completion body ------------------------------------------------------------------------

LOOKUP = {"type": "function", "function": {"name": "lookup"}}
GET_WEATHER = {"type": "function", "function": {"name": "get_weather"}}
NAMED = {
    "tools": [GET_WEATHER, LOOKUP],
    "tool_choice": {"type": "function", "function": {"name": "lookup"}},
}
REQUIRED = {"tools": [GET_WEATHER, LOOKUP], "tool_choice": "required"}


def choice_of(body: dict[str, Any], text: str, finish_reason: str) -> dict[str, Any]:
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
    choice: dict[str, Any] = completion["choices"][0]
    return choice


def test_a_cut_named_call_is_a_call_with_partial_arguments_and_length() -> None:
    choice = choice_of(NAMED, '<tool_call>\n{"name":"lookup","arguments":{"i', FINISH_LENGTH)

    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None
    (made,) = choice["message"]["tool_calls"]
    assert made["function"] == {"name": "lookup", "arguments": '{"i'}
    assert made["id"] == call_id("chatcmpl-1:0", 0)
    with pytest.raises(ValueError):
        json.loads(made["function"]["arguments"])


def test_a_reply_cut_before_any_name_holds_no_markup_and_no_call() -> None:
    choice = choice_of(REQUIRED, '<tool_call>\n{"name":"', FINISH_LENGTH)

    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None
    assert "tool_calls" not in choice["message"]


def test_finish_reason_of_complete_calls_follows_the_reference() -> None:
    named = choice_of(NAMED, OLD_LOOKUP, FINISH_STOP)
    required = choice_of(REQUIRED, TWO_CALLS, FINISH_STOP)
    auto = choice_of({"tools": [LOOKUP, GET_WEATHER]}, OLD_WEATHER, FINISH_STOP)
    preface = choice_of({"tools": [LOOKUP]}, "Looking it up.\n" + OLD_LOOKUP, FINISH_STOP)

    assert named["finish_reason"] == "stop"  # tool_choice names the function
    assert [c["function"]["name"] for c in named["message"]["tool_calls"]] == ["lookup"]
    assert required["finish_reason"] == "tool_calls"
    assert len(required["message"]["tool_calls"]) == 2
    assert auto["finish_reason"] == "tool_calls"
    assert preface["finish_reason"] == "tool_calls"
    assert preface["message"]["content"] == "Looking it up."


def test_text_replies_and_tool_choice_none_are_left_as_text() -> None:
    auto_text = choice_of({"tools": [LOOKUP]}, "Just words.", FINISH_STOP)
    none = choice_of({"tools": [LOOKUP], "tool_choice": "none"}, "<b>hi</b>", FINISH_STOP)

    assert auto_text["message"]["content"] == "Just words." and auto_text["finish_reason"] == "stop"
    assert none["message"]["content"] == "<b>hi</b>" and "tool_calls" not in none["message"]


def test_grammars_compile_without_a_vocabulary(family: Family) -> None:
    """At upload no vocabulary is loaded: the markers are written as text."""
    for body in (
        {"tools": TOOLS},
        {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
        {"response_format": JSON_FORMAT, "tools": TOOLS},
    ):
        grammar = family.dialect.grammar(body, opened=family.opened)
        assert grammar is not None
        validate(grammar)
