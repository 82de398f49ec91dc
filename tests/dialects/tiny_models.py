"""Tiny random-weight models of each family's architecture, with the family's real tokenizer,
chat template and end-of-turn ids (tests/formats/families.py), for end-to-end tests.

    path = tiny_model_dir("qwen3", tmp_root)   # built once under tmp_root, then reused

A directory is what an operator downloads: `config.json` and `model.safetensors` (random
weights, hidden size 32, 2 layers, 4 query and 2 K/V heads), the family directory's
`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja` and its
`generation_config.json` end-of-turn ids. The embedding has the released model's vocabulary
size where it is at least the tokenizer's length (its rows past the tokenizer are padding, as
in the releases), else the tokenizer's length rounded up to a multiple of 64. With hidden
size 32 even Gemma 3's 262,208 rows are 8 M parameters: a build takes about a second.

Where the engine does not serve a family's own architecture, the nearest one it serves is
used and `Architecture.about` says so: DeepSeek V3.1 (DeepSeek-V3's MLA and experts) is a
Llama-architecture model here, driven by the real DeepSeek tokenizer and template.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ARCHITECTURES", "Architecture", "tiny_model_dir", "tokenizer_length"]

# Bump when a built directory would differ for the same family.
BUILD_VERSION = 1
_MARKER = "tiny-model.json"
_SEED = 20260339
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)

# Every family's shape: the embedding dominates, the layers are a rounding error.
_SHAPE: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
_ALTERNATING = ["sliding_attention", "full_attention"]


@dataclass(frozen=True)
class Architecture:
    """The architecture a family's tiny model is built with."""

    model_type: str  # inference/engine/families.py TEXT_FAMILIES
    vocab_size: int  # the released model's embedding rows
    about: str = ""


def _config(model_type: str, vocab_size: int, eos: list[int]) -> Any:
    import transformers as tf

    common = {**_SHAPE, "vocab_size": vocab_size, "eos_token_id": eos, "bos_token_id": None}
    common["pad_token_id"] = None
    if model_type == "llama":
        return tf.LlamaConfig(**common)
    if model_type == "mistral":
        return tf.MistralConfig(**common, sliding_window=None)
    if model_type == "qwen2":
        return tf.Qwen2Config(**common)
    if model_type == "qwen3":
        return tf.Qwen3Config(**common)
    if model_type == "qwen3_moe":
        return tf.Qwen3MoeConfig(
            **common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
        )
    if model_type == "phi3":
        return tf.Phi3Config(**{k: v for k, v in common.items() if k != "head_dim"})
    if model_type == "gemma3_text":
        return tf.Gemma3TextConfig(**common, sliding_window=512, layer_types=_ALTERNATING)
    if model_type == "gpt_oss":
        return tf.GptOssConfig(
            **common,
            sliding_window=128,
            layer_types=_ALTERNATING,
            num_local_experts=4,
            num_experts_per_tok=2,
            rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
        )
    raise ValueError(f"no tiny {model_type!r} model")


ARCHITECTURES: dict[str, Architecture] = {
    "qwen2.5": Architecture("qwen2", 152064),
    "hermes3": Architecture("llama", 128256),
    "qwen3": Architecture("qwen3", 151936),
    "qwq": Architecture("qwen2", 152064),
    "qwen3-coder": Architecture("qwen3_moe", 151936),
    "llama3.1": Architecture("llama", 128256),
    "llama3.2": Architecture("llama", 128256),
    "llama3.3": Architecture("llama", 128256),
    "gpt-oss": Architecture("gpt_oss", 201088),
    "deepseek-v3.1": Architecture(
        "llama",
        129280,
        about="DeepSeek V3.1's architecture (MLA, experts) is not one the engine serves: a "
        "Llama-architecture model with the real DeepSeek tokenizer and template.",
    ),
    "deepseek-r1-distill-qwen": Architecture("qwen2", 152064),
    "deepseek-r1-distill-llama": Architecture(
        "llama",
        128256,
        about="The family's DeepSeek tokenizer (128,815 tokens) is longer than Llama's 128,256 "
        "rows: the embedding has 128,832.",
    ),
    "mistral-nemo": Architecture("mistral", 131072),
    "mistral-small-3.2": Architecture(
        "mistral",
        131072,
        about="The language model of Mistral Small 3.2 (its vision tower left out).",
    ),
    "gemma3": Architecture("gemma3_text", 262208),
    "phi3.5": Architecture("phi3", 32064),
}


def tiny_model_dir(family: str, tmp_root: Path) -> Path:
    """The tiny model of `family` under `tmp_root` (built on first use; atomic, so a crashed
    build never leaves half a directory)."""
    out = Path(tmp_root) / family
    if _built(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{family}.", dir=out.parent))
    try:
        _build(family, staged)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staged, out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return out


def _built(out: Path) -> bool:
    try:
        return json.loads((out / _MARKER).read_text())["build"] == BUILD_VERSION
    except (OSError, ValueError, KeyError, TypeError):
        return False


def tokenizer_length(path: Path) -> int:
    """The length of the tokenizer saved at `path` (its highest id, plus one), read from the
    file: loading a 150k-token tokenizer takes a second or two."""
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    ids = list(vocab.values()) if isinstance(vocab, dict) else [len(vocab) - 1]
    ids += [token["id"] for token in data.get("added_tokens") or []]
    return max(ids) + 1


def _build(family: str, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from inference.demo.model import sharpen_output_head
    from tests.formats.families import family_dir

    source = family_dir(family)
    architecture = ARCHITECTURES[family]
    length = tokenizer_length(source / "tokenizer.json")
    vocab_size = architecture.vocab_size
    if vocab_size < length:
        vocab_size = -(-length // 64) * 64
    eos = [
        int(i) for i in json.loads((source / "generation_config.json").read_text())["eos_token_id"]
    ]
    config = _config(architecture.model_type, vocab_size, eos)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        model = AutoModelForCausalLM.from_config(config)
    # Peaked logits (std ~3), as the demo model's: greedy decoding has clear winners.
    sharpen_output_head(model, config.hidden_size)
    model.generation_config = GenerationConfig(eos_token_id=eos)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    for name in _TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copyfile(source / name, out / name)
    marker = {
        "build": BUILD_VERSION,
        "family": family,
        "model_type": architecture.model_type,
        "vocab_size": vocab_size,
        "tokenizer_length": length,
        "about": architecture.about,
    }
    (out / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")
