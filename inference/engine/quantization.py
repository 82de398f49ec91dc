"""Which quantized directories the engine loads, read from their `quantization_config`.

transformers loads a quantized checkpoint by its config's `quant_method`, with a kernel
package per method. The rule lives here so `manage.py model inspect|add` (without torch) and
the loader refuse the same directories with the same words: a method outside the list, a
kernel package that is not installed, bitsandbytes without a CUDA device.
"""

from __future__ import annotations

import importlib.util
from typing import Any

# quant_method → (the name in messages, the packages transformers needs to load it, whether
# its kernels need a CUDA device).
_METHODS: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "bitsandbytes": ("bitsandbytes", ("bitsandbytes",), True),
    "gptq": ("GPTQ", ("optimum", "gptqmodel"), False),
    "awq": ("AWQ", ("gptqmodel",), False),
}


def quantization_of(config: Any) -> dict[str, Any] | None:
    """{"quant_method", "bits", "group_size" when set} of a `quantization_config` (a dict,
    or transformers' object for it); None for unquantized weights."""
    if config is None:
        return None
    if not isinstance(config, dict):
        config = config.to_dict()
    if not config:
        return None
    method = str(config.get("quant_method") or "")
    if not method and (config.get("load_in_8bit") or config.get("load_in_4bit")):
        method = "bitsandbytes"  # configs written before quant_method existed
    bits = config.get("bits")
    if config.get("load_in_4bit"):
        bits = 4
    elif config.get("load_in_8bit"):
        bits = 8
    found: dict[str, Any] = {"quant_method": method or "unknown", "bits": bits}
    if config.get("group_size") is not None:
        found["group_size"] = config["group_size"]
    return found


def missing_packages(method: str) -> list[str]:
    """The kernel packages `method` needs that are not installed (checked without importing)."""
    _, packages, _ = _METHODS[method]
    return [name for name in packages if importlib.util.find_spec(name) is None]


def quantization_refusal(quantization: dict[str, Any] | None) -> str | None:
    """Why weights quantized as `quantization` (from `quantization_of`) are never served,
    whatever the machine, or None."""
    if quantization is None:
        return None
    method = quantization["quant_method"]
    if method not in _METHODS:
        served = ", ".join(name for name, _, _ in _METHODS.values())
        return f"weights quantized with {method!r} are not served (quantizations served: {served})"
    if method == "bitsandbytes" and quantization.get("bits") not in (4, 8):
        return "bitsandbytes weights must be 8-bit or 4-bit (load_in_8bit or load_in_4bit)"
    return None


def quantization_machine_refusal(quantization: dict[str, Any] | None, *, cuda: bool) -> str | None:
    """Why this machine cannot serve weights quantized as `quantization`, or None: a kernel
    that needs a CUDA device where the engine runs on the CPU (`cuda` False), a kernel
    package not installed."""
    refused = quantization_refusal(quantization)
    if refused or quantization is None:
        return refused
    method = quantization["quant_method"]
    name, _, needs_cuda = _METHODS[method]
    if needs_cuda and not cuda:
        return (
            f"{name} {quantization.get('bits')}-bit weights need a CUDA device, and this "
            "machine's engine runs on the CPU: serve them on a GPU worker, or serve the "
            "unquantized weights"
        )
    missing = missing_packages(method)
    if missing:
        return (
            f"{name} weights need the {' and '.join(missing)} package"
            f"{'s' if len(missing) > 1 else ''}, not installed: pip install {' '.join(missing)}"
        )
    return None
