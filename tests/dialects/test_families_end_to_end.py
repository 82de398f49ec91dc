"""End to end, per model family (issue 39's acceptance): a tiny random-weight model of the
family's architecture with the family's real tokenizer and chat template
(tests/dialects/tiny_models.py) is put in the catalog as an operator does (`manage.py model
add`, which finds its dialect in the template), then driven by the grammar through a batch
and through `POST /v1/chat/completions`, streamed and not, all read by the `openai` SDK in
strict mode. Every tool call's arguments are JSON valid against the function's parameters,
every JSON answer is valid against its schema, and no `content` or `reasoning_content` holds
the family's markup.

DeepSeek V3.1's own architecture (MLA, experts) is not one the engine serves: its tiny model
is a Llama-architecture model driven by the real DeepSeek tokenizer and template.

Random weights wander, so the requests keep them short: greedy decoding (`temperature` 0),
schemas whose values are an enum, a bounded integer or a string of at most 8 lowercase
letters, and reasoning ended at once. Qwen3 and DeepSeek V3.1 take `reasoning_effort: "none"`
(the template then closes the reasoning in the prompt, and the grammar allows none); families
that always reason first (QwQ, the R1 distills, GPT-OSS's analysis channel) get a `logit_bias`
of 100 on the token that ends the reasoning (`</think>`, harmony's `<|end|>`), else a random
model fills `max_tokens` with reasoning and never reaches the answer. One more batch row
leaves their reasoning free and cuts it with `max_tokens`: it comes back as
`reasoning_content`, without markup, counted in `reasoning_tokens`.
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from django.core.management import call_command
from openai import OpenAI
from openai.types.chat import ChatCompletion

from inference.dialects import DIALECTS, Dialect
from tests.batches.conftest import in_process_worker, sdk, short_linger  # noqa: F401
from tests.conftest import INTERACTIVE_PRICES, PRICES, jsonl
from tests.dialects.conftest import load_family
from tests.dialects.tiny_models import tiny_model_dir

pytestmark = [
    pytest.mark.model,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("short_linger"),
]


@dataclass(frozen=True)
class Family:
    name: str  # tests/formats/families.py
    dialect: str  # what `model add` must find in its chat template
    tools: bool = True
    effort: str | None = None  # reasoning_effort sent: "none" closes the reasoning
    ends_reasoning: str | None = None  # the token logit_bias favours to end the reasoning


FAMILIES = (
    # Hermes 3 is not here: llama.cpp keeps only its tool_use template, which fails without
    # `tools`, so `model add` refuses it (qwen2.5 drives the hermes dialect end to end).
    Family("qwen2.5", "hermes"),
    Family("qwen3", "qwen3", effort="none"),
    Family("qwq", "qwq", ends_reasoning="</think>"),
    Family("qwen3-coder", "qwen3_coder"),
    Family("llama3.1", "llama3_json"),
    Family("llama3.2", "llama3_json"),
    Family("llama3.3", "llama3_json"),
    Family("gpt-oss", "harmony", ends_reasoning="<|end|>"),
    Family("deepseek-v3.1", "deepseek_v3", effort="none"),
    Family("deepseek-r1-distill-qwen", "deepseek_r1", tools=False, ends_reasoning="</think>"),
    Family("deepseek-r1-distill-llama", "deepseek_r1", tools=False, ends_reasoning="</think>"),
    Family("mistral-nemo", "mistral"),
    Family("mistral-small-3.2", "mistral_v11"),
    Family("gemma3", "plain", tools=False),
    Family("phi3.5", "plain", tools=False),
)

WORD = {"type": "string", "maxLength": 8, "pattern": "^[a-z]*$"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": WORD, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "An order by its number.",
        "parameters": {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["id"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
TOOLS = [WEATHER, LOOKUP]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["yes", "no"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 100},
        "note": WORD,
    },
    "required": ["label", "score", "note"],
    "additionalProperties": False,
}
ANSWER_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "answer", "strict": True, "schema": SCHEMA},
}
NAMED = {"type": "function", "function": {"name": "lookup"}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris? Answer briefly."}]
# Markup no content may hold, whatever the family (besides each family's own markers).
MARKUP = (
    "<|",
    "|>",
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "<think>",
    "</think>",
    "<｜",
    "<function=",
    "<parameter=",
    "<start_of_turn>",
    "<end_of_turn>",
)
BATCH_SECONDS = 240


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-families")


def _add(family: Family, weights: Path) -> dict[str, Any]:
    """`manage.py model add` as an operator runs it, with batch and interactive prices."""
    prices = [str(p) for p in PRICES]
    interactive = [str(p) for p in INTERACTIVE_PRICES]
    out = io.StringIO()
    call_command(
        "model", "--json", "add", f"e2e/{family.name}", "--weights", str(weights),
        "--price-input", prices[0], "--price-cached-input", prices[1],
        "--price-output", prices[2], "--interactive-input", interactive[0],
        "--interactive-cached-input", interactive[1], "--interactive-output", interactive[2],
        stdout=out,
    )  # fmt: skip
    return json.loads(out.getvalue())


class Checks:
    """Each named check of a family, run to the end: a failure is recorded, not raised, so
    that one bug does not hide the others."""

    def __init__(self) -> None:
        self.failed: dict[str, str] = {}

    def run(self, name: str, check: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return check(*args, **kwargs)
        except (AssertionError, openai.APIError, json.JSONDecodeError) as exc:
            self.failed.setdefault(name, f"{type(exc).__name__}: {exc}"[:2000])
            return None


class Reader:
    """What a family's replies must look like."""

    def __init__(self, family: Family, dialect: Dialect) -> None:
        self.family = family
        self.dialect = dialect
        tokenizer = load_family(family.name)
        special = {
            t.content
            for t in tokenizer.added_tokens_decoder.values()
            if t.special and len(t.content) >= 3
        }
        self.markup = sorted({*MARKUP, *dialect.markers, *dialect.turn_ends, *special})
        self.reasons = family.effort != "none" and (
            dialect.thinking is not None or dialect.name == "harmony"
        )

    def body(self, kind: str, *, stream: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"temperature": 0, "max_completion_tokens": 200}
        if kind == "required":
            # One call: random weights would write parallel calls until max_tokens (the
            # read-back tests cover parallel calls in every syntax).
            body |= {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
        elif kind == "named":
            body |= {"tools": TOOLS, "tool_choice": NAMED}
        elif kind in ("schema", "thinking"):
            body["response_format"] = ANSWER_FORMAT
        if self.family.effort is not None:
            body["reasoning_effort"] = self.family.effort
        if self.family.ends_reasoning and kind != "thinking":
            tokenizer = load_family(self.family.name)
            ends = tokenizer.convert_tokens_to_ids(self.family.ends_reasoning)
            body["logit_bias"] = {str(ends): 100}
        if kind == "thinking":
            body["max_completion_tokens"] = 12
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return body

    def clean(self, text: str | None, where: str) -> None:
        if text is None:
            return
        found = [m for m in self.markup if m in text]
        assert not found, f"{where} holds markup {found}: {text!r}"

    def check(self, kind: str, completion: ChatCompletion) -> None:
        (choice,) = completion.choices
        message = choice.message
        reasoning = (message.model_extra or {}).get("reasoning_content")
        self.clean(message.content, "content")
        self.clean(reasoning, "reasoning_content")
        usage = completion.usage
        assert usage is not None and usage.completion_tokens_details is not None
        thought = usage.completion_tokens_details.reasoning_tokens or 0
        if reasoning:
            assert 0 < thought <= usage.completion_tokens, (reasoning, usage)
        if not self.reasons:
            assert reasoning is None and thought == 0, (reasoning, usage)
        if kind == "thinking":
            # Cut inside the reasoning, or answered: either way the reasoning is read out.
            if choice.finish_reason == "length" and message.content is None:
                assert thought == usage.completion_tokens, usage
            return
        assert choice.finish_reason != "length", f"{kind}: cut by max_tokens: {completion}"
        if kind == "schema":
            assert choice.finish_reason == "stop", choice
            assert not message.tool_calls
            jsonschema.validate(json.loads(message.content or ""), SCHEMA)
            return
        assert choice.finish_reason == ("tool_calls" if kind == "required" else "stop"), choice
        assert message.tool_calls, f"{kind}: no tool calls: {message}"
        if kind == "named":
            assert [c.function.name for c in message.tool_calls] == ["lookup"], message
        for call in message.tool_calls:
            assert call.type == "function" and call.id
            assert call.function.name in PARAMETERS, call
            arguments = json.loads(call.function.arguments)
            jsonschema.validate(arguments, PARAMETERS[call.function.name])


def _streamed(client: OpenAI, model: str, body: dict[str, Any]) -> ChatCompletion:
    """A streamed completion put together from its chunks as a client does, reasoning deltas
    checked to come before content deltas."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    usage = None
    for chunk in client.chat.completions.create(model=model, messages=MESSAGES, **body):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            thought = (delta.model_extra or {}).get("reasoning_content")
            if thought:
                assert not content, "reasoning_content after content"
                reasoning.append(thought)
            if delta.content:
                content.append(delta.content)
            for call in delta.tool_calls or []:
                whole = calls.setdefault(call.index, {"arguments": ""})
                if call.id:
                    whole["id"] = call.id
                if call.function and call.function.name:
                    whole["name"] = call.function.name
                if call.function and call.function.arguments:
                    whole["arguments"] += call.function.arguments
            if choice.finish_reason:
                finish = choice.finish_reason
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = [
            {
                "id": c.get("id", ""),
                "type": "function",
                "function": {"name": c.get("name", ""), "arguments": c["arguments"]},
            }
            for _, c in sorted(calls.items())
        ]
    return ChatCompletion.model_validate(
        {
            "id": "streamed",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage.model_dump() if usage is not None else None,
        }
    )


def _same(streamed: ChatCompletion, plain: ChatCompletion) -> None:
    """Greedy decoding: the stream says what the plain request said."""
    a, b = streamed.choices[0], plain.choices[0]
    assert a.finish_reason == b.finish_reason
    assert a.message.content == b.message.content
    assert (a.message.model_extra or {}).get("reasoning_content") == (
        b.message.model_extra or {}
    ).get("reasoning_content")
    assert [(c.function.name, c.function.arguments) for c in a.message.tool_calls or []] == [
        (c.function.name, c.function.arguments) for c in b.message.tool_calls or []
    ]
    assert streamed.usage is not None and plain.usage is not None
    assert streamed.usage.completion_tokens == plain.usage.completion_tokens


def _batch(client: OpenAI, name: str, rows: list[dict[str, Any]]) -> dict[str, ChatCompletion]:
    """Run `rows` as one batch; each row's completion as the SDK reads it."""
    file = client.files.create(file=("rows.jsonl", jsonl(*rows)), purpose="batch")
    batch = client.batches.create(
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_headers={"Idempotency-Key": f"e2e-{name}"},
    )
    deadline = time.monotonic() + BATCH_SECONDS
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    errors = client.files.content(batch.error_file_id).text if batch.error_file_id else ""
    assert batch.status == "completed", (batch, errors)
    assert batch.request_counts is not None and batch.request_counts.failed == 0, errors
    assert batch.output_file_id is not None
    completions = {}
    for line in client.files.content(batch.output_file_id).text.splitlines():
        row = json.loads(line)
        assert row["response"]["status_code"] == 200, row
        completions[row["custom_id"]] = ChatCompletion.model_validate(row["response"]["body"])
    return completions


def _row(custom_id: str, model: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": MESSAGES, **body},
    }


def _refused_tools(client: OpenAI, reader: Reader, model: str) -> None:
    """A family without a tool syntax refuses tools, naming the model: at upload and
    interactively."""
    rows = [_row("tools", model, reader.body("required"))]
    with pytest.raises(openai.BadRequestError) as upload:
        client.files.create(file=("rows.jsonl", jsonl(*rows)), purpose="batch")
    assert f"model {model!r} has no tool-call syntax" in json.dumps(upload.value.body), upload
    with pytest.raises(openai.BadRequestError) as interactive:
        client.chat.completions.create(model=model, messages=MESSAGES, **reader.body("required"))
    assert f"model {model!r} has no tool-call syntax" in json.dumps(interactive.value.body)


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_family_end_to_end(
    family: Family,
    tiny_root: Path,
    sdk: OpenAI,  # noqa: F811 (the fixture imported above)
    in_process_worker: Any,  # noqa: F811
) -> None:
    started = time.monotonic()
    added = _add(family, tiny_model_dir(family.name, tiny_root))
    assert added["revision"]["dialect"] == family.dialect, added
    model = added["name"]
    reader = Reader(family, DIALECTS[family.dialect])
    checks = Checks()
    kinds = ["required", "named", "schema"] if family.tools else ["schema"]
    batch_kinds = kinds + (["thinking"] if family.ends_reasoning else [])

    completions = checks.run(
        "batch",
        _batch,
        sdk,
        family.name,
        [_row(kind, model, reader.body(kind)) for kind in batch_kinds],
    )
    for kind in batch_kinds:
        if completions is not None:
            checks.run(f"batch {kind}", reader.check, kind, completions[kind])
    if not family.tools:
        checks.run("tools refused", _refused_tools, sdk, reader, model)

    for kind in ("required", "schema") if family.tools else ("schema",):
        plain = checks.run(
            f"interactive {kind}",
            sdk.chat.completions.create,
            model=model,
            messages=MESSAGES,
            **reader.body(kind),
        )
        if plain is not None:
            checks.run(f"interactive {kind}", reader.check, kind, plain)
        streamed = checks.run(
            f"streamed {kind}", _streamed, sdk, model, reader.body(kind, stream=True)
        )
        if streamed is not None:
            checks.run(f"streamed {kind}", reader.check, kind, streamed)
            if plain is not None:
                checks.run(f"streamed {kind} = plain", _same, streamed, plain)

    print(f"{family.name}: {time.monotonic() - started:.1f} s")
    assert not checks.failed, json.dumps(checks.failed, indent=1, ensure_ascii=False)
