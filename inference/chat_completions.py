"""Translate between Chat Completions bodies and engine requests/results (SPEC §6)."""

from __future__ import annotations

from typing import Any

from inference.engine.chat import render_prompt
from inference.engine.types import GenerationResult, SamplingParams


def max_output_tokens(body: dict[str, Any]) -> int:
    return int(body.get("max_completion_tokens") or body["max_tokens"])


def prompt_ids(tokenizer: Any, body: dict[str, Any]) -> list[int]:
    return render_prompt(tokenizer, body["messages"])


def sampling_params(body: dict[str, Any]) -> SamplingParams:
    stop = body.get("stop")
    stops: tuple[str, ...] = (stop,) if isinstance(stop, str) else tuple(stop or ())
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
    )


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
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": model_config_id,
        "choices": [
            {
                "index": choice.index,
                "message": {"role": "assistant", "content": choice.text, "refusal": None},
                "finish_reason": choice.finish_reason,
                "logprobs": None,
            }
            for choice in result.choices
        ],
        "usage": usage_payload(
            prompt=result.prompt_tokens,
            cached=result.cached_tokens,
            completion=result.completion_tokens,
        ),
    }
