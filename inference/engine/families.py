"""Which model families the engine serves, read from a model's `config.json` alone.

One place for the rule, so a revision the engine would refuse is refused when it is created
(`manage.py model inspect|add`, the admin's revision form), never row by row as
`internal_error`. Plain dictionaries in, a reason out: no torch, no transformers.

The families are those the engine matches `model.generate` token for token on (prefix cache
on and off, preemption, chunked prefill, n > 1; tests/inference/test_engine_families.py). A
family outside the list is refused with the list in the message; extending the list is a code
change with its exactness test.
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
    "mixtral": "Mixtral",
    "qwen3_moe": "Qwen3-MoE",
    "gpt_oss": "GPT-OSS",
}
# Families whose positions are ALiBi biases: refused by name.
ALIBI_FAMILIES: dict[str, str] = {"bloom": "BLOOM", "mpt": "MPT"}
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


def engine_refusal(config: dict[str, Any]) -> str | None:
    """Why the engine cannot run this model whatever its family's name (ALiBi positions: the
    engine passes positions, not the 2-D padding mask ALiBi biases are built from)."""
    model_type = str(config.get("model_type") or "")
    if model_type in ALIBI_FAMILIES or text_config(config).get("alibi"):
        name = ALIBI_FAMILIES.get(model_type) or TEXT_FAMILIES.get(model_type, model_type)
        return f"{name} with ALiBi positions is not supported by the engine"
    return None


def refusal(config: dict[str, Any], *, context_length: int) -> str | None:
    """Why the engine cannot serve this model at `context_length`, or None. Sliding windows
    (Mistral, Qwen2, Gemma 2 and 3, GPT-OSS) are served at any context length."""
    refused = engine_refusal(config)
    if refused:
        return refused
    model_type = str(config.get("model_type") or "")
    if model_type in MEDIA_FAMILIES or model_type in TEXT_FAMILIES:
        return None
    names = sorted({*TEXT_FAMILIES.values(), *MEDIA_FAMILIES.values()})
    return (
        f"the architecture {model_type or 'unknown'!r} is not one the engine serves "
        f"(it serves {', '.join(names)})"
    )
