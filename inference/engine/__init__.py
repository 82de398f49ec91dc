"""A plain generation library: token ids in, tokens and usage out. Knows nothing of Django."""

from typing import Any

from .config import EngineConfig
from .types import (
    Choice,
    GenerationRequest,
    GenerationResult,
    MediaInput,
    SamplingParams,
)

# The engine and the loader need torch; the request types do not, and the web tier (which
# must never import torch) uses those. So the heavy names load lazily.
_LAZY = {"Engine": ".engine", "ModelLoadError": ".loading", "load_model": ".loading"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(name)


__all__ = [
    "Choice",
    "Engine",
    "EngineConfig",
    "GenerationRequest",
    "GenerationResult",
    "MediaInput",
    "ModelLoadError",
    "SamplingParams",
    "load_model",
]
