"""Which model families the engine serves, read from a model's `config.json` alone.

One place for the rule, so a revision the engine would refuse is refused when it is created
(`manage.py model inspect|add`, the admin's revision form), never row by row as
`internal_error`. Plain dictionaries in, a reason out: no torch, no transformers.

The families are those the engine matches `model.generate` token for token on (prefix cache
on and off, preemption, chunked prefill, n > 1). A family outside the list is refused with the
list in the message; extending the list is a code change with its exactness test.
"""

from __future__ import annotations

from typing import Any

# model_type → the family's name in messages.
TEXT_FAMILIES: dict[str, str] = {
    "llama": "Llama",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "phi3": "Phi-3",
    "gemma2": "Gemma 2",
    "gemma3": "Gemma 3",
    "gemma3_text": "Gemma 3",
    "gpt2": "GPT-2",
    "gpt_neox": "GPT-NeoX",
    "opt": "OPT",
    "gptj": "GPT-J",
    "falcon": "Falcon",
}
# Families with media encoders the engine drives (inference.media_layout).
MEDIA_FAMILIES: dict[str, str] = {"llava": "LLaVA", "qwen2_audio": "Qwen2-Audio"}

_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (multimodal configs nest it)."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


def context_length_of(config: dict[str, Any]) -> int | None:
    text = text_config(config)
    for key in _CONTEXT_KEYS:
        value = text.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def kv_heads_of(config: dict[str, Any]) -> int:
    """K/V heads per layer as the family's attention caches them (an estimate from the
    config: the engine itself reads them from one cached step, engine.runner)."""
    text = text_config(config)
    heads = int(text.get("num_attention_heads") or text.get("n_head") or 0)
    if config.get("model_type") == "falcon":
        # Multi-query Falcon caches one head; with the new decoder architecture it caches
        # every query head (num_kv_heads groups only the projection).
        multi_query = text.get("multi_query", True) and not text.get("new_decoder_architecture")
        return 1 if multi_query else heads
    return int(text.get("num_key_value_heads") or heads)


def window_refusal(text: dict[str, Any], *, context_length: int) -> str | None:
    """Why a language model config's sliding window keeps the engine from serving it."""
    window = text.get("sliding_window")
    if window and text.get("use_sliding_window", True) and window < context_length:
        return (
            f"the model attends through a sliding window of {window} tokens, shorter than the "
            f"context length {context_length}: the engine does not support sliding windows "
            f"yet; serve it with --context-length {window} or less"
        )
    return None


def refusal(config: dict[str, Any], *, context_length: int) -> str | None:
    """Why the engine cannot serve this model at `context_length`, or None."""
    model_type = str(config.get("model_type") or "")
    if model_type in MEDIA_FAMILIES:
        return None
    if model_type not in TEXT_FAMILIES:
        names = sorted({*TEXT_FAMILIES.values(), *MEDIA_FAMILIES.values()})
        return (
            f"the architecture {model_type or 'unknown'!r} is not one the engine serves "
            f"(it serves {', '.join(names)})"
        )
    text = text_config(config)
    if text.get("alibi"):
        return f"{TEXT_FAMILIES[model_type]} with ALiBi positions is not supported by the engine"
    return window_refusal(text, context_length=context_length)
