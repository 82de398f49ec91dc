"""Loading a model revision's weights and tokenizer from local files only."""

from __future__ import annotations

from typing import Any

import torch
from safetensors import SafetensorError

from inference.engine.quantization import quantization_machine_refusal, quantization_of
from inference.media_layout import ENGINE_MEDIA_ARCHITECTURES

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


class ModelLoadError(Exception):
    """The weights or tokenizer of a revision cannot be loaded (missing, not cached, malformed)."""


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """`auto` is fp32 on CPU (bf16 matmuls there are several times slower) and bf16 on CUDA."""
    if dtype == "auto":
        return torch.float32 if device.startswith("cpu") else torch.bfloat16
    try:
        return _DTYPES[dtype.lower()]
    except KeyError:
        raise ModelLoadError(
            f"unknown dtype {dtype!r}; use auto or one of {sorted(_DTYPES)}"
        ) from None


def load_model(
    weights: str,
    *,
    tokenizer: str | None = None,
    dtype: str = "auto",
    device: str | None = None,
    chat_template: str | None = None,
    revision: str | None = None,
    tensor_parallel_size: int = 1,
) -> tuple[Any, Any]:
    """Load (model, tokenizer) for generation; never touches the network.

    `weights` is a local directory or a hub id already in the local cache. The model is in eval
    mode on `device` (default: cuda when available, else cpu), spread over all GPUs with
    accelerate when there is more than one. `chat_template` replaces the tokenizer's own.

    With `tensor_parallel_size` N > 1 this process is one of N ranks (torch.distributed is
    initialized, lockstep.py): transformers shards the weights by the family's plan and puts
    this rank's part on the device it binds. A quantized directory (its config's
    `quantization_config`) is loaded by transformers' quantizer for that method, whole on
    `device`.

    Only `*.safetensors` weights load: a pickled `pytorch_model.bin` beside them is never
    opened (unpickling runs code), and a directory with only pickled weights is refused.
    """
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForMultimodalLM,
        AutoTokenizer,
    )

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = resolve_dtype(dtype, device)
    parallel = tensor_parallel_size > 1
    spread = not parallel and device == "cuda" and torch.cuda.device_count() > 1
    options: dict[str, Any] = {"local_files_only": True}
    if revision:
        options["revision"] = revision
    try:
        config = AutoConfig.from_pretrained(weights, **options)
        # Architectures with media encoders (LLaVA, Qwen2-Audio) are not causal-LM classes.
        auto = (
            AutoModelForMultimodalLM
            if config.model_type in ENGINE_MEDIA_ARCHITECTURES
            else AutoModelForCausalLM
        )
        quantized = getattr(config, "quantization_config", None) is not None
        if quantized:
            refused = quantization_machine_refusal(
                quantization_of(config.quantization_config), cuda=device.startswith("cuda")
            )
            if refused:
                raise ModelLoadError(refused)
        placement: dict[str, Any] = {}
        if parallel:
            from transformers.distributed import DistributedConfig

            placement["distributed_config"] = DistributedConfig(tp_size=tensor_parallel_size)
        elif spread:
            placement["device_map"] = "auto"
        elif quantized:  # quantized layers are placed as they load; `.to` refuses them
            placement["device_map"] = {"": device}
        model: Any = auto.from_pretrained(
            weights, dtype=torch_dtype, use_safetensors=True, **placement, **options
        )
        tok = AutoTokenizer.from_pretrained(tokenizer or weights, **options)
    # SafetensorError: a truncated or corrupt weights file (not an OSError).
    except (OSError, ValueError, KeyError, ImportError, RuntimeError, SafetensorError) as exc:
        raise ModelLoadError(f"cannot load {weights!r}: {exc}") from exc
    if not placement:
        model.to(device)
    model.eval()
    if chat_template:
        tok.chat_template = chat_template
    if not tok.chat_template:
        raise ModelLoadError(f"{tokenizer or weights!r} has no chat template and none was given")
    return model, tok


def load_processor(weights: str, *, revision: str | None = None) -> Any:
    """The revision's processor (image processor or feature extractor + tokenizer), for media
    rows; local files only."""
    from transformers import AutoProcessor

    options: dict[str, Any] = {"local_files_only": True}
    if revision:
        options["revision"] = revision
    try:
        return AutoProcessor.from_pretrained(weights, **options)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        raise ModelLoadError(f"cannot load the processor of {weights!r}: {exc}") from exc
