"""Results read back in the revision's dialect (inference/chat_completions.py): reasoning in
`reasoning_content` and counted in `reasoning_tokens`, logprobs of the answer only, and a
stream's chunks carrying reasoning deltas before content deltas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from batches.interactive.streaming import Chunks
from inference.chat_completions import completion_body, sampling_params
from inference.dialects import DIALECTS
from inference.dialects.streams import ReplyStream
from inference.engine.types import (
    FINISH_LENGTH,
    FINISH_STOP,
    Choice,
    GenerationResult,
    SamplingParams,
    TokenLogprob,
)

REPLY = "<think>\nThe user asks 2+2. That is 4.\n</think>\n\n2+2 equals 4."


@pytest.fixture(scope="module")
def qwen3_tokenizer(tiny_model_dir: Path):
    """The demo tokenizer speaking the qwen3 dialect (`<think>` is text to it)."""
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir), local_files_only=True)
    tokenizer.dialect = DIALECTS["qwen3"]
    return tokenizer


def result_of(tokenizer, text: str, *, finish: str = FINISH_STOP, logprobs: bool = False):
    ids = tokenizer.encode(text, add_special_tokens=False)
    entries = (
        [TokenLogprob(i, tokenizer.decode([i]).encode(), False, -0.5, []) for i in ids]
        if logprobs
        else None
    )
    choice = Choice(0, ids, text, finish, entries)
    return GenerationResult("r", [choice], 5, len(ids), 0, 0.1, params=SamplingParams(64))


def body_of(tokenizer, text: str, **kwargs) -> dict:
    return completion_body(
        result_of(tokenizer, text, **kwargs),
        completion_id="chatcmpl-1",
        model="m",
        model_config_id="mcfg_1",
        created=0,
        tokenizer=tokenizer,
    )


def test_reasoning_goes_to_reasoning_content_and_is_counted(qwen3_tokenizer):
    body = body_of(qwen3_tokenizer, REPLY)
    message = body["choices"][0]["message"]
    assert message["content"] == "2+2 equals 4."
    assert message["reasoning_content"] == "The user asks 2+2. That is 4."
    reasoning = body["usage"]["completion_tokens_details"]["reasoning_tokens"]
    answer = len(qwen3_tokenizer.encode("2+2 equals 4.", add_special_tokens=False))
    # Every token before the answer is reasoning, its markup included.
    total = body["usage"]["completion_tokens"]
    assert 0 < reasoning < total and total - reasoning in (answer, answer + 1)


def test_reasoning_cut_by_max_tokens_has_no_content(qwen3_tokenizer):
    body = body_of(qwen3_tokenizer, "<think>\nThe user asks", finish=FINISH_LENGTH)
    choice = body["choices"][0]
    assert choice["message"]["content"] is None
    assert choice["message"]["reasoning_content"] == "The user asks"
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == usage["completion_tokens"]


def test_a_reply_without_reasoning_has_no_reasoning_content(qwen3_tokenizer):
    body = body_of(qwen3_tokenizer, "Just the answer.")
    message = body["choices"][0]["message"]
    assert message["content"] == "Just the answer." and "reasoning_content" not in message
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


def test_logprobs_cover_the_answer_only(qwen3_tokenizer):
    body = body_of(qwen3_tokenizer, REPLY, logprobs=True)
    tokens = [entry["token"] for entry in body["choices"][0]["logprobs"]["content"]]
    assert "".join(tokens).strip() == "2+2 equals 4."


def test_the_grammar_lets_reasoning_run_free_before_the_schema(qwen3_tokenizer):
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 32,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}},
    }
    free = sampling_params(body, tokenizer=qwen3_tokenizer, prompt=[1, 2, 3])
    assert free.constraint is not None and "THOUGHT" in free.constraint.grammar
    # A prompt that closed the reasoning (thinking off): the answer alone.
    closed = qwen3_tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    answer_only = sampling_params(body, tokenizer=qwen3_tokenizer, prompt=closed)
    assert answer_only.constraint is not None and "THOUGHT" not in answer_only.constraint.grammar
    opened = qwen3_tokenizer.encode("assistant\n<think>\n", add_special_tokens=False)
    assert sampling_params(body, tokenizer=qwen3_tokenizer, prompt=opened).reasoning_opened


def test_a_stream_sends_reasoning_before_content_and_joins_into_the_message(qwen3_tokenizer):
    stream = ReplyStream(DIALECTS["qwen3"])
    chunks = Chunks(
        completion_id="chatcmpl-1",
        model="m",
        created=0,
        fingerprint="mcfg_1",
        tier="default",
        include_usage=False,
        n=1,
        buffer_text=False,
    )
    events = list(chunks.opening())
    ids = qwen3_tokenizer.encode(REPLY, add_special_tokens=False)
    text = ""
    for i in range(1, len(ids) + 1):  # token by token, as the engine yields partials
        whole = qwen3_tokenizer.decode(ids[:i])
        piece, text = whole[len(text) :], whole
        reasoning, content = stream.push(piece)
        events += chunks.partial(0, content, reasoning)
    events += chunks.closing(body_of(qwen3_tokenizer, REPLY))
    deltas = [
        json.loads(e.removeprefix(b"data: "))["choices"][0]["delta"]
        for e in events
        if e.startswith(b"data: {")
    ]
    reasoning = [d["reasoning_content"] for d in deltas if d.get("reasoning_content")]
    content = [d["content"] for d in deltas if d.get("content")]
    assert "".join(reasoning) == "The user asks 2+2. That is 4."
    assert "".join(content) == "2+2 equals 4."
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    last_reasoning = max(i for i, d in enumerate(deltas) if d.get("reasoning_content"))
    assert last_reasoning < first_content
    assert not any("<think>" in s or "</think>" in s for s in reasoning + content)
    assert deltas[0] == {"role": "assistant", "content": ""}
