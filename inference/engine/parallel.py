"""Which revisions can run tensor-parallel, read from `config.json` alone (no torch).

A revision with `tensor_parallel_size` N > 1 runs one engine across N ranks of one machine,
its weights sharded by transformers' own plan for the family (`base_model_tp_plan`). The
rule lives here, beside the families, so `manage.py model`, the admin's form and the engine
process refuse the same revisions with the same words. How the ranks run is lockstep.py.
"""

from __future__ import annotations

from typing import Any

from .families import TEXT_FAMILIES, text_config

# The text families whose transformers configuration carries a tensor-parallel plan (a test
# holds this list to the pinned transformers). The media families have none: their encoders
# would run whole on every rank.
TENSOR_PARALLEL_FAMILIES = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text", "gpt_neox", "gptj"}
)


def tensor_parallel_refusal(config: dict[str, Any], size: int) -> str | None:
    """Why `config`'s model cannot be sharded across `size` ranks, or None when it can.

    Each rank holds `heads / size` query heads and `kv heads / size` key/value heads of every
    layer, so both must divide evenly."""
    if size < 1:
        return f"tensor_parallel_size must be 1 or more, not {size}"
    if size == 1:
        return None
    model_type = str(config.get("model_type") or "")
    if model_type not in TENSOR_PARALLEL_FAMILIES:
        name = TEXT_FAMILIES.get(model_type, model_type or "this model")
        served = ", ".join(sorted({TEXT_FAMILIES[t] for t in TENSOR_PARALLEL_FAMILIES}))
        return (
            f"{name} has no tensor-parallel plan in transformers, so it cannot be split across "
            f"{size} devices; serve it with tensor_parallel_size 1 (families with a plan: "
            f"{served})"
        )
    text = text_config(config)
    heads = int(text.get("num_attention_heads") or text.get("n_head") or 0)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    for what, count in (("attention heads", heads), ("key/value heads", kv_heads)):
        if count % size:
            return (
                f"the model's {count} {what} do not divide across {size} devices: use a "
                f"tensor_parallel_size that divides {count}"
            )
    return None


def device_refusal(size: int, cuda_devices: int) -> str | None:
    """Why `size` ranks do not fit a machine with `cuda_devices` visible GPUs (0: the ranks
    are CPU processes, which any machine has)."""
    if cuda_devices and size > cuda_devices:
        return (
            f"tensor_parallel_size {size} needs {size} GPUs and this machine has {cuda_devices} "
            "visible"
        )
    return None
