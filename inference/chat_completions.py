"""Translate between Chat Completions bodies and engine requests/results (SPEC §6)."""

from __future__ import annotations

from typing import Any

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
)
from inference.structured import (
    grammar_for,
    parse_tool_calls,
    response_schema,
    tool_choice_mode,
)

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
        return render_prompt(tokenizer, body["messages"], body.get("tools") or None)
    counts = [layout.placeholder_count() for _ in media_parts(body["messages"])]
    return media_prompt(tokenizer, body, layout=layout, counts=counts).ids


def media_prompt(
    tokenizer: Any, body: dict[str, Any], *, layout: MediaLayout, counts: list[int]
) -> RenderedPrompt:
    """The prompt of a row on a revision with media, `counts[i]` placeholders for part i."""
    return render_media_prompt(
        tokenizer, body["messages"], body.get("tools") or None, layout=layout, counts=counts
    )


def sampling_params(body: dict[str, Any]) -> SamplingParams:
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
        constraint=ConstraintSpec(grammar) if (grammar := grammar_for(body)) else None,
        tool_calls=tool_calls(body),
    )


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


def usage_payload(*, prompt: int, cached: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def completion_body(
    result: GenerationResult, *, completion_id: str, model: str, model_config_id: str, created: int
) -> dict[str, Any]:
    tools = result.params.tool_calls if result.params is not None else None
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": model_config_id,
        "choices": [
            _choice(choice, seed=f"{completion_id}:{choice.index}", tools=tools)
            for choice in result.choices
        ],
        "usage": usage_payload(
            prompt=result.prompt_tokens,
            cached=result.cached_tokens,
            completion=result.completion_tokens,
        ),
    }


def _choice(choice: Choice, *, seed: str, tools: ToolCalls | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": choice.text, "refusal": None}
    finish_reason = choice.finish_reason
    calls = parse_tool_calls(choice.text, seed=seed, names=tools.names) if tools else None
    if calls is not None:
        # The reply is its calls, as the reference gives it: no text beside them, a call cut by
        # max_tokens among them ("length"); none when it was cut before a name was written.
        message["content"] = None
        if calls:
            message["tool_calls"] = calls
        if finish_reason == FINISH_STOP and tools is not None and not tools.named:
            finish_reason = FINISH_TOOL_CALLS
    return {
        "index": choice.index,
        "message": message,
        "finish_reason": finish_reason,
        "logprobs": _logprobs(choice.logprobs) if choice.logprobs is not None else None,
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
