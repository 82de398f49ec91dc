"""Translate between Chat Completions bodies and engine requests/results (docs/API.md).

The revision's dialect (inference/dialects), carried by its tokenizer as `tokenizer.dialect`,
decides the grammar of a reply and how its text is read back: reasoning into
`reasoning_content`, calls into `tool_calls`, the answer into `content`.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from inference.dialects import DIALECTS, Dialect, Marks, Reply, call_id
from inference.engine.decoding import TextDecoder
from inference.engine.types import (
    FINISH_STOP,
    Choice,
    ConstraintSpec,
    GenerationResult,
    SamplingParams,
    TokenLogprob,
    ToolCalls,
)
from inference.media_layout import MediaLayout
from inference.rendering import (
    RenderedPrompt,
    media_parts,
    render_media_prompt,
    render_prompt,
    template_options,
)
from inference.structured import response_schema, tool_choice_mode

FINISH_TOOL_CALLS = "tool_calls"


def max_output_tokens(body: dict[str, Any]) -> int:
    return int(body.get("max_completion_tokens") or body["max_tokens"])


def prompt_ids(tokenizer: Any, body: dict[str, Any]) -> list[int]:
    """The prompt's token ids, for counting. On a revision with media (the web tier's
    ChatTokenizer carries its `media_layout`) each part counts as the placeholders it expands
    to; audio, whose length is known only once decoded, as the longest clip allowed."""
    layout: MediaLayout | None = getattr(tokenizer, "media_layout", None)
    if layout is None:
        # Tools are shown to the model even under tool_choice "none", as the reference does.
        return render_prompt(
            tokenizer,
            body["messages"],
            body.get("tools") or None,
            template_options(tokenizer, body),
        )
    counts = [layout.placeholder_count() for _ in media_parts(body["messages"])]
    return media_prompt(tokenizer, body, layout=layout, counts=counts).ids


def media_prompt(
    tokenizer: Any, body: dict[str, Any], *, layout: MediaLayout, counts: list[int]
) -> RenderedPrompt:
    """The prompt of a row on a revision with media, `counts[i]` placeholders for part i."""
    return render_media_prompt(
        tokenizer,
        body["messages"],
        body.get("tools") or None,
        layout=layout,
        counts=counts,
        options=template_options(tokenizer, body),
    )


def dialect_of(tokenizer: Any) -> Dialect:
    """The revision's dialect its tokenizer carries; hermes for a bare tokenizer (benchmarks,
    engine tests), as every revision spoke before dialects."""
    return getattr(tokenizer, "dialect", None) or DIALECTS["hermes"]


def sampling_params(
    body: dict[str, Any], *, tokenizer: Any = None, prompt: list[int] | None = None
) -> SamplingParams:
    """The engine's parameters for a body. With the revision's `tokenizer` and the `prompt`
    ids, the grammar is written in the revision's dialect, its markers as the vocabulary's
    tokens, and a prompt that opened the reasoning is noted."""
    dialect = dialect_of(tokenizer)
    opened = closed = False
    if tokenizer is not None and prompt:
        tail = tokenizer.decode(prompt[-8:], skip_special_tokens=False)
        opened, closed = dialect.opened(tail), dialect.closed(tail)
    marks = _marks(tokenizer, dialect) if tokenizer is not None else Marks()
    # `closed` only where it says something (a dialect that reasons in a syntax of its own
    # never closes its reasoning in the prompt).
    grammar = dialect.grammar(
        body, opened=opened, marks=marks, **({"closed": True} if closed else {})
    )
    stop = body.get("stop")
    stops: tuple[str, ...] = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if output_constrained(body):
        # The grammar decides where the output ends: a stop string found inside a JSON value
        # would cut it into invalid JSON that still reads finish_reason "stop" (docs/API.md).
        stops = ()
    return SamplingParams(
        max_new_tokens=max_output_tokens(body),
        temperature=float(body["temperature"]) if body.get("temperature") is not None else 1.0,
        top_p=float(body["top_p"]) if body.get("top_p") is not None else 1.0,
        n=int(body.get("n") or 1),
        stop=stops,
        seed=body.get("seed"),
        presence_penalty=float(body.get("presence_penalty") or 0.0),
        frequency_penalty=float(body.get("frequency_penalty") or 0.0),
        logit_bias={int(k): float(v) for k, v in (body.get("logit_bias") or {}).items()},
        logprobs=body.get("logprobs") is True,
        top_logprobs=int(body.get("top_logprobs") or 0),
        constraint=ConstraintSpec(grammar) if grammar else None,
        tool_calls=tool_calls(body),
        reasoning_opened=opened,
    )


_reading: weakref.WeakKeyDictionary[Any, tuple[Marks, TextDecoder]] = weakref.WeakKeyDictionary()
_reading_lock = threading.Lock()


def _marks(tokenizer: Any, dialect: Dialect) -> Marks:
    return _reader(tokenizer, dialect)[0]


def _reader(tokenizer: Any, dialect: Dialect) -> tuple[Marks, TextDecoder]:
    """(the dialect's markers that are single tokens, the decoder the engine reads with), once
    per tokenizer: both read the whole vocabulary."""
    with _reading_lock:
        found = _reading.get(tokenizer)
    if found is None:
        vocab = tokenizer.get_vocab()
        # With ids: a marker whose name is not `<…>` (Mistral's `[TOOL_CALLS]`) is written by
        # its id, else the grammar would spell it as text the model cannot write.
        marks = Marks.in_vocabulary(vocab, dialect.markers)
        found = (marks, TextDecoder(tokenizer, dialect.markup))
        with _reading_lock:
            _reading[tokenizer] = found
    return found


def output_constrained(body: dict[str, Any]) -> bool:
    """Whether a grammar decides the whole output: JSON asked by `response_format`, or a tool
    call forced by `tool_choice` (`required` or a named function). Under `auto` without a
    JSON format the output may be free text, which stop strings still end."""
    if response_schema(body.get("response_format")) is not None:
        return True
    mode, _ = tool_choice_mode(body)
    return bool(body.get("tools")) and mode in ("required", "function")


def tool_calls(body: dict[str, Any]) -> ToolCalls | None:
    """How the row's tool calls are read back; None when its output cannot be tool calls."""
    tools = body.get("tools") or []
    mode, named = tool_choice_mode(body)
    if not tools or mode == "none":
        return None
    if named is not None:
        return ToolCalls(names=(named,), named=True)
    return ToolCalls(names=tuple(tool["function"]["name"] for tool in tools))


def usage_payload(
    *, prompt: int, cached: int, completion: int, reasoning: int = 0
) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


_RELAYED_MESSAGE = ("role", "content", "refusal", "tool_calls", "reasoning_content")


def relayed_completion_body(
    result: GenerationResult,
    *,
    completion_id: str,
    model: str,
    model_config_id: str,
    created: int,
) -> dict[str, Any]:
    """The Chat Completions body of a result an external engine answered (`result.response`,
    its server's body): its choices as the server gave them (the message's content, refusal,
    tool calls and reasoning, the finish reason, logprobs), under Boardwalk's id, model name
    and fingerprint, with the usage the result carries (the server's, or counted with the
    revision's tokenizer where it gave none: docs/BILLING.md)."""
    response = result.response or {}
    choices = []
    for index, choice in enumerate(response.get("choices") or []):
        message = choice.get("message") or {}
        kept = {k: message[k] for k in _RELAYED_MESSAGE if message.get(k) is not None}
        kept.setdefault("role", "assistant")
        kept.setdefault("content", None)
        choices.append(
            {
                "index": choice.get("index", index),
                "message": kept,
                "finish_reason": choice.get("finish_reason") or "stop",
                "logprobs": choice.get("logprobs"),
            }
        )
    details = (response.get("usage") or {}).get("completion_tokens_details") or {}
    reasoning = int(details.get("reasoning_tokens") or 0)
    return _envelope(result, completion_id, model, model_config_id, created, choices, reasoning)


def _envelope(
    result: GenerationResult,
    completion_id: str,
    model: str,
    model_config_id: str,
    created: int,
    choices: list[dict[str, Any]],
    reasoning: int,
) -> dict[str, Any]:
    """A Chat Completions body around its choices, with the result's usage."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": model_config_id,
        "choices": choices,
        "usage": usage_payload(
            prompt=result.prompt_tokens,
            cached=result.cached_tokens,
            completion=result.completion_tokens,
            reasoning=reasoning,
        ),
    }


def completion_body(
    result: GenerationResult,
    *,
    completion_id: str,
    model: str,
    model_config_id: str,
    created: int,
    tokenizer: Any = None,
) -> dict[str, Any]:
    """The Chat Completions body of a result, read in the dialect of the revision whose
    `tokenizer` generated it (without one: hermes, and no reasoning tokens counted)."""
    params = result.params
    tools = params.tool_calls if params is not None else None
    opened = params.reasoning_opened if params is not None else False
    dialect = dialect_of(tokenizer)
    decoder = _reader(tokenizer, dialect)[1] if tokenizer is not None else None
    choices, reasoning = [], 0
    for choice in result.choices:
        reply = dialect.read(choice.text, names=tools.names if tools else (), opened=opened)
        thought = _reasoning_tokens(choice, reply, decoder)
        reasoning += thought
        choices.append(
            _choice(
                choice, reply, seed=f"{completion_id}:{choice.index}", tools=tools, skip=thought
            )
        )
    return _envelope(result, completion_id, model, model_config_id, created, choices, reasoning)


def result_body(result: GenerationResult, *, tokenizer: Any = None, **names: Any) -> dict[str, Any]:
    """The Chat Completions body of any result: an external engine's answer relayed
    (`relayed_completion_body`, when the result carries the server's `response`), the
    engine's own read in the revision's dialect (`completion_body`) otherwise. `names`:
    `completion_id`, `model`, `model_config_id` and `created`, as both take them."""
    if result.response is not None:
        return relayed_completion_body(result, **names)
    return completion_body(result, tokenizer=tokenizer, **names)


def _reasoning_tokens(choice: Choice, reply: Reply, decoder: TextDecoder | None) -> int:
    """How many of the choice's tokens are reasoning (its markup included): those before the
    answer. A reply cut inside its reasoning is reasoning throughout."""
    if reply.answer_at <= 0 or decoder is None:
        return 0
    ids = choice.token_ids
    if reply.answer_at >= len(choice.text):
        return len(ids)
    low, high = 0, len(ids)  # the fewest tokens whose text reaches the answer
    while low < high:
        middle = (low + high) // 2
        if len(decoder.decode(ids[:middle])) >= reply.answer_at:
            high = middle
        else:
            low = middle + 1
    return low


def _choice(
    choice: Choice, reply: Reply, *, seed: str, tools: ToolCalls | None, skip: int
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    finish_reason = choice.finish_reason
    if reply.calls is not None:
        # A call cut by max_tokens is among them ("length"); none when it was cut before a
        # name was written.
        if reply.calls:
            message["tool_calls"] = [
                {
                    "id": call_id(seed, index),
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
                for index, (name, arguments) in enumerate(reply.calls)
            ]
        if finish_reason == FINISH_STOP and tools is not None and not tools.named:
            finish_reason = FINISH_TOOL_CALLS
    logprobs = choice.logprobs[skip:] if choice.logprobs is not None else None
    return {
        "index": choice.index,
        "message": message,
        "finish_reason": finish_reason,
        "logprobs": _logprobs(logprobs) if logprobs is not None else None,
    }


def _logprobs(tokens: list[TokenLogprob]) -> dict[str, Any]:
    """The reference's `choices[].logprobs`: one entry per token of the text (end-of-sequence
    tokens, which are not in the text, left out)."""
    return {
        "content": [
            {
                **_token_entry(entry.token, entry.logprob),
                "top_logprobs": [_token_entry(raw, logprob) for _, raw, logprob in entry.top],
            }
            for entry in tokens
            if not entry.special
        ],
        "refusal": None,
    }


def _token_entry(raw: bytes, logprob: float) -> dict[str, Any]:
    return {
        "token": raw.decode("utf-8", errors="replace"),
        "logprob": logprob,
        "bytes": list(raw),
    }
