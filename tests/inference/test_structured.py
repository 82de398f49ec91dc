"""Structured outputs, tool calls and logprobs, by real generation on the tiny demo model.

The demo model has random weights: left alone it never writes JSON. Every valid output here
comes from the grammar masks, which is the point.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import llguidance
import pytest
import torch

from inference.chat_completions import completion_body, prompt_ids, sampling_params
from inference.engine import Engine, EngineConfig, GenerationRequest, load_model
from inference.engine.sampling import row_sampling, sample
from inference.engine.types import ERROR_INTERNAL, ConstraintSpec

pytestmark = pytest.mark.model

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "label": {"enum": ["positive", "negative", "neutral"]},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "count": {"type": "integer", "minimum": -5, "maximum": 500},
        },
        "required": ["label", "score", "count"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
                    "tags": {
                        "type": "array",
                        "items": {"enum": ["a", "b", "c"]},
                        "minItems": 1,
                        "maxItems": 3,
                    },
                },
                "required": ["code", "tags"],
            },
            "ok": {"type": "boolean"},
        },
        "required": ["person", "ok"],
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "exclusiveMinimum": 0, "maximum": 99},
                "word": {"type": "string", "maxLength": 4},
            },
            "required": ["id"],
            "additionalProperties": False,
        },
        "maxItems": 3,
    },
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["c", "f"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
        },
        "strict": True,
    },
}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["id"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Engine:
    model, tokenizer = load_model(str(tiny_model_dir))
    return Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=16))


def body(**fields: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "Classify this review: the bread was great."}],
        "max_completion_tokens": 80,
        **fields,
    }


def run(engine: Engine, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The completion bodies of `bodies`, generated in one continuous batch, in input order."""
    requests = [
        GenerationRequest(str(i), prompt_ids(engine.tokenizer, b), sampling_params(b))
        for i, b in enumerate(bodies)
    ]
    results = {r.id: r for r in engine.generate(requests)}
    return [
        completion_body(
            results[str(i)],
            completion_id=f"chatcmpl-{i}",
            model="m",
            model_config_id="c",
            created=1,
        )
        for i in range(len(bodies))
    ]


def schema_format(schema: dict[str, Any], *, strict: bool = False) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema, "strict": strict},
    }


def test_json_schema_output_always_validates(engine):
    bodies = [
        body(response_format=schema_format(schema), seed=seed, temperature=1.0)
        for schema in SCHEMAS
        for seed in range(8)
    ]

    completions = run(engine, bodies)

    complete = 0
    for request, completion in zip(bodies, completions, strict=True):
        choice = completion["choices"][0]
        if choice["finish_reason"] == "length":
            continue
        assert choice["finish_reason"] == "stop"
        schema = request["response_format"]["json_schema"]["schema"]
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        complete += 1
    assert complete >= len(bodies) // 2  # bounded schemas: most rows finish


def test_strict_mode_closes_objects_and_requires_every_property(engine):
    schema = {
        "type": "object",
        "properties": {
            "a": {"enum": [1, 2]},
            "b": {"type": "object", "properties": {"c": {"type": "boolean"}}},
        },
    }
    bodies = [body(response_format=schema_format(schema, strict=True), seed=s) for s in range(6)]

    for completion in run(engine, bodies):
        choice = completion["choices"][0]
        assert choice["finish_reason"] == "stop"
        value = json.loads(choice["message"]["content"])
        assert set(value) == {"a", "b"} and set(value["b"]) == {"c"}


def test_a_stop_string_inside_the_json_does_not_cut_it(engine):
    # Every output of this schema holds '"a":' and '{': the grammar ends it, not the stops.
    schema = {"type": "object", "properties": {"a": {"enum": [1, 2]}}}
    stops = ['"a"', ":", "{"]
    bodies = [
        body(response_format=schema_format(schema, strict=True), stop=stops, seed=s)
        for s in range(4)
    ] + [
        body(
            tools=[LOOKUP],
            tool_choice={"type": "function", "function": {"name": "lookup"}},
            stop=['"id"', "<tool_call>"],
            seed=s,
            max_completion_tokens=300,
        )
        for s in range(4)
    ]

    completions = run(engine, bodies)

    for completion in completions[:4]:
        choice = completion["choices"][0]
        assert choice["finish_reason"] == "stop"
        assert json.loads(choice["message"]["content"]) in ({"a": 1}, {"a": 2})
    for completion in completions[4:]:
        choice = completion["choices"][0]
        assert choice["finish_reason"] == "stop"
        (call,) = choice["message"]["tool_calls"]
        jsonschema.validate(
            json.loads(call["function"]["arguments"]), LOOKUP["function"]["parameters"]
        )


def test_stop_strings_apply_to_free_text_only(engine):
    stops = ["}", "x"]
    assert sampling_params(body(stop=stops)).stop == ("}", "x")
    assert sampling_params(body(stop="}", tools=[LOOKUP])).stop == ("}",)  # auto: may be text
    assert sampling_params(body(stop=stops, tools=[LOOKUP], tool_choice="none")).stop
    assert not sampling_params(body(stop=stops, response_format={"type": "json_object"})).stop
    assert not sampling_params(body(stop=stops, tools=[LOOKUP], tool_choice="required")).stop


def test_json_object_output_parses(engine):
    bodies = [
        body(response_format={"type": "json_object"}, seed=seed, max_completion_tokens=200)
        for seed in range(10)
    ]

    completions = run(engine, bodies)

    finished = [c["choices"][0] for c in completions if c["choices"][0]["finish_reason"] == "stop"]
    for choice in finished:
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    for completion in completions:
        assert completion["choices"][0]["message"]["content"].startswith("{")


def test_forced_tool_call_has_valid_arguments(engine):
    named = {"type": "function", "function": {"name": "lookup"}}
    bodies = [
        body(tools=[WEATHER, LOOKUP], tool_choice=choice, seed=seed, max_completion_tokens=300)
        for choice in ("required", named)
        for seed in range(5)
    ]

    completions = run(engine, bodies)

    schemas = {
        "get_weather": {
            **WEATHER["function"]["parameters"],
            "additionalProperties": False,
            "required": ["city", "unit", "days"],
        },
        "lookup": LOOKUP["function"]["parameters"],
    }
    for request, completion in zip(bodies, completions, strict=True):
        choice = completion["choices"][0]
        # As the reference answers: "tool_calls" for required, "stop" for a named function.
        expected = "tool_calls" if request["tool_choice"] == "required" else "stop"
        assert choice["finish_reason"] == expected, choice
        assert choice["message"]["content"] is None
        calls = choice["message"]["tool_calls"]
        assert calls and len({c["id"] for c in calls}) == len(calls)
        for call in calls:
            assert call["id"].startswith("call_") and call["type"] == "function"
            name = call["function"]["name"]
            jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[name])
        if request["tool_choice"] != "required":
            assert [c["function"]["name"] for c in calls] == ["lookup"]


def test_a_named_call_cut_by_max_tokens_is_a_call_with_the_arguments_so_far(engine):
    named = {"type": "function", "function": {"name": "get_weather"}}
    bodies = [
        body(tools=[WEATHER, LOOKUP], tool_choice=named, seed=tokens, max_completion_tokens=tokens)
        for tokens in range(1, 64, 3)
    ]

    completions = run(engine, bodies)

    partial = 0
    for completion in completions:
        choice = completion["choices"][0]
        assert choice["finish_reason"] == "length", choice
        assert choice["message"]["content"] is None  # never the template's markup
        (call,) = choice["message"]["tool_calls"]
        assert call["id"].startswith("call_") and call["type"] == "function"
        assert call["function"]["name"] == "get_weather"
        arguments = call["function"]["arguments"]
        assert isinstance(arguments, str) and "<" not in arguments
        try:
            json.loads(arguments)
        except ValueError:
            partial += arguments.startswith("{")
    assert partial  # some rows were cut inside the arguments, which come back as written


def test_required_calls_cut_by_max_tokens_keep_the_complete_ones(engine):
    names = {"get_weather", "lookup"}
    bodies = [
        body(tools=[WEATHER, LOOKUP], tool_choice="required", seed=seed, max_completion_tokens=90)
        for seed in range(12)
    ]

    completions = run(engine, bodies)

    for completion in completions:
        choice = completion["choices"][0]
        message = choice["message"]
        assert message["content"] is None
        calls = message.get("tool_calls") or []
        assert {c["function"]["name"] for c in calls} <= names
        complete = calls if choice["finish_reason"] == "tool_calls" else calls[:-1]
        for call in complete:  # every call before the cut parses
            json.loads(call["function"]["arguments"])
        if choice["finish_reason"] == "tool_calls":
            assert calls


def test_a_grammar_with_no_way_on_fails_the_row_rather_than_stop_empty(engine):
    # A schema with no finite value, past the upload check (which refuses it): the engine
    # must not answer the row "stop" with an output its grammar never completed.
    endless = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}
    grammar = llguidance.LLMatcher.grammar_from_lark(
        "%llguidance {}\nstart: answer\nanswer: %json " + json.dumps(endless) + "\n"
    )
    request = body(max_completion_tokens=8)
    params = sampling_params(request)
    params.constraint = ConstraintSpec(grammar)
    plain = GenerationRequest(
        "plain", prompt_ids(engine.tokenizer, request), sampling_params(request)
    )

    results = {
        r.id: r
        for r in engine.generate(
            [GenerationRequest("dead", prompt_ids(engine.tokenizer, request), params), plain]
        )
    }

    assert results["dead"].error == ERROR_INTERNAL and results["dead"].choices == []
    assert results["plain"].error is None and results["plain"].choices  # its batch is unharmed


def test_parallel_tool_calls_false_allows_one_call(engine):
    bodies = [
        body(
            tools=[LOOKUP],
            tool_choice="required",
            parallel_tool_calls=False,
            seed=seed,
            max_completion_tokens=300,
        )
        for seed in range(5)
    ]
    for completion in run(engine, bodies):
        assert len(completion["choices"][0]["message"]["tool_calls"]) == 1


def test_tool_choice_none_answers_in_text(engine):
    bodies = [
        body(tools=[LOOKUP], tool_choice="none", seed=seed, max_completion_tokens=20)
        for seed in range(4)
    ]
    for completion in run(engine, bodies):
        choice = completion["choices"][0]
        assert "tool_calls" not in choice["message"]
        assert isinstance(choice["message"]["content"], str)
        assert choice["finish_reason"] in ("stop", "length")


def test_tool_history_is_rendered_and_accepted(engine):
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 degrees"},
    ]
    request = body(messages=history, tools=[WEATHER], max_completion_tokens=5)

    text = engine.tokenizer.decode(prompt_ids(engine.tokenizer, request))

    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<|im_start|>tool\nsunny, 21 degrees<|im_end|>" in text
    assert '"name": "get_weather"' in text.split("<|im_start|>user")[0]  # tools listed first
    (completion,) = run(engine, [request])
    assert completion["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")


def test_mixed_constrained_and_unconstrained_rows_in_one_batch(engine):
    plain = body(seed=7, temperature=0.8, max_completion_tokens=30)
    constrained = body(response_format=schema_format(SCHEMAS[0]), seed=7)
    alone_plain = run(engine, [plain])[0]["choices"][0]
    alone_constrained = run(engine, [constrained])[0]["choices"][0]

    mixed = run(engine, [plain, constrained, plain, constrained])

    # Seeded rows give the same output whatever shares their batch, masks included.
    assert mixed[0]["choices"][0]["message"] == alone_plain["message"]
    assert mixed[2]["choices"][0]["message"] == alone_plain["message"]
    assert mixed[1]["choices"][0]["message"] == alone_constrained["message"]
    jsonschema.validate(json.loads(alone_constrained["message"]["content"]), SCHEMAS[0])
    assert not alone_plain["message"]["content"].startswith("{")


def _reference_logprobs(engine: Engine, prompt: list[int], tokens: list[int], **sampling):
    """log_softmax of the model's own logits at each generated position (transformers,
    decoding token by token over its own cache, as the engine does), with the request's
    penalties and temperature applied the documented way. The engine's masked, batched
    attention rounds differently from transformers' own in float32: on this random-weight
    model a logit moves by up to ~1e-2, hence the tolerance here; `sample()` itself is checked
    exactly in test_sample_logprobs_are_the_log_softmax_of_the_processed_logits."""
    model = engine.model
    logits = []
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        for token in tokens:
            logits.append(out.logits[0, -1].float())
            out = model(
                input_ids=torch.tensor([[token]]),
                cache=out.past_key_values,
                use_cache=True,
            )
    result = []
    for position, row in enumerate(logits):
        row = row.clone()
        history = tokens[:position]
        if history:
            counts = torch.bincount(torch.tensor(history), minlength=row.shape[0]).float()
            row -= sampling.get("frequency_penalty", 0.0) * counts
            row -= sampling.get("presence_penalty", 0.0) * (counts > 0)
        temperature = sampling.get("temperature", 1.0) or 1.0
        result.append(torch.log_softmax(row / temperature, dim=-1))
    return result


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0.0},
        {"temperature": 0.7, "seed": 3},
        {"temperature": 1.3, "seed": 4, "frequency_penalty": 0.5, "presence_penalty": 0.3},
    ],
)
def test_logprobs_match_a_log_softmax_of_the_model_logits(engine, sampling):
    request = body(logprobs=True, top_logprobs=5, max_completion_tokens=12, **sampling)
    prompt = prompt_ids(engine.tokenizer, request)
    params = sampling_params(request)
    params.ignore_eos = True

    (result,) = engine.generate([GenerationRequest("r", prompt, params)])
    (choice,) = result.choices
    completion = completion_body(
        result, completion_id="chatcmpl-1", model="m", model_config_id="c", created=1
    )

    expected = _reference_logprobs(engine, prompt, choice.token_ids, **sampling)
    entries = completion["choices"][0]["logprobs"]["content"]
    assert len(entries) == len(choice.token_ids)
    for token, entry, reference in zip(choice.token_ids, entries, expected, strict=True):
        assert entry["logprob"] == pytest.approx(float(reference[token]), abs=2e-2)
        assert bytes(entry["bytes"]) == engine.tokenizer.decode([token]).encode() or (
            entry["token"] == bytes(entry["bytes"]).decode("utf-8", errors="replace")
        )
        top = entry["top_logprobs"]
        assert len(top) == 5
        values, _ = reference.topk(5)
        assert [t["logprob"] for t in top] == pytest.approx(values.tolist(), abs=2e-2)
        assert top[0]["logprob"] >= entry["logprob"] - 1e-6
    if sampling["temperature"] == 0.0:
        assert all(e["logprob"] == pytest.approx(e["top_logprobs"][0]["logprob"]) for e in entries)


def test_logprobs_of_a_constrained_row_come_from_the_masked_distribution(engine):
    request = body(
        response_format=schema_format({"enum": ["yes", "no"]}),
        logprobs=True,
        top_logprobs=20,
        temperature=0,
    )

    (completion,) = run(engine, [request])

    choice = completion["choices"][0]
    assert choice["message"]["content"] in ('"yes"', '"no"')
    first = choice["logprobs"]["content"][0]
    # Only a quote can start the answer: it holds all the mass, and nothing else is offered.
    assert first["token"].startswith('"') and first["logprob"] == pytest.approx(0.0, abs=1e-6)
    assert all(t["token"].startswith('"') for t in first["top_logprobs"])
    assert (
        "".join(e["token"] for e in choice["logprobs"]["content"]) == choice["message"]["content"]
    )


def test_sample_logprobs_are_the_log_softmax_of_the_processed_logits(engine):
    vocab = len(engine.tokenizer)
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(0)) * 3
    params = [
        sampling_params(body(logprobs=True, top_logprobs=4, temperature=0.5, seed=1)),
        sampling_params(
            body(
                logprobs=True,
                top_logprobs=2,
                temperature=0,
                logit_bias={"7": 5},
                presence_penalty=1.0,
            )
        ),
    ]
    rows = [
        row_sampling(
            p, choice=0, eos_ids=[0], vocab_size=vocab, device="cpu", tokenizer=engine.tokenizer
        )
        for p in params
    ]
    histories = [[], [9, 9]]
    processed = logits.clone()
    processed[1, 7] += 5
    processed[1, 9] -= 1.0

    tokens = sample(logits.clone(), rows, histories)

    for i, (row, temperature) in enumerate(zip(rows, (0.5, 1.0), strict=True)):
        expected = torch.log_softmax(processed[i] / temperature, dim=-1)
        (entry,) = row.logprobs
        assert entry.token_id == tokens[i]
        assert entry.logprob == pytest.approx(float(expected[tokens[i]]), abs=1e-6)
        values, ids = expected.topk(len(entry.top))
        assert [t[0] for t in entry.top] == ids.tolist()
        assert [t[2] for t in entry.top] == pytest.approx(values.tolist(), abs=1e-6)
    assert tokens[1] == int(processed[1].argmax())
