"""A plain generation library: token ids in, tokens and usage out. Knows nothing of Django."""

from .chat import render_prompt
from .engine import Engine
from .loading import ModelLoadError, load_model
from .types import Choice, GenerationRequest, GenerationResult, SamplingParams

__all__ = [
    "Choice",
    "Engine",
    "GenerationRequest",
    "GenerationResult",
    "ModelLoadError",
    "SamplingParams",
    "load_model",
    "render_prompt",
]
