"""Requests for the engine tests on the tiny model: a user turn as prompt ids, greedy sampling."""

from __future__ import annotations

from typing import Any

from inference.engine import SamplingParams
from inference.rendering import render_prompt


def prompt(tokenizer: Any, text: str, *, system: str | None = None) -> list[int]:
    messages = [{"role": "system", "content": system}] if system else []
    return render_prompt(tokenizer, [*messages, {"role": "user", "content": text}])


def greedy(max_new_tokens: int, **options: Any) -> SamplingParams:
    """Greedy decoding of exactly `max_new_tokens` (end-of-sequence ignored)."""
    return SamplingParams(
        max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True, **options
    )
