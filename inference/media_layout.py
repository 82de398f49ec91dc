"""Where media goes in a revision's prompts, read from its files without torch.

A media part is rendered as one placeholder token, which the model's processor expands into as
many copies as the encoder yields feature vectors: fixed per image (LLaVA: one per patch),
proportional to the duration for audio (Qwen2-Audio: one per 40 ms). The web tier counts prompt
tokens with this (credit holds), the worker lays out the prompt with it, and the engine replaces
the copies with the encoder's features. Only architectures whose encoder the engine runs
(inference/engine/media.py) have a layout; a revision cannot publish a modality without one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# model_type (config.json) → the modality the engine runs for it.
ENGINE_MEDIA_ARCHITECTURES = {"llava": "image", "qwen2_audio": "audio"}


class LayoutUnavailable(Exception):
    """The revision's config cannot be read, or its architecture's media is not supported."""


@dataclass(frozen=True)
class MediaLayout:
    modality: str  # "image" | "audio"
    token: str  # the placeholder as text, e.g. "<image>"
    token_id: int
    image_tokens: int = 0  # per image
    sampling_rate: int = 16_000  # audio: the feature extractor's rate
    hop_length: int = 160  # audio: samples per feature frame
    max_audio_seconds: int = 30  # audio: one encoder window

    def placeholder_count(self, audio_samples: int | None = None) -> int:
        """Placeholder tokens one part expands to; audio of unknown length counts as the
        longest allowed (an upper bound, for credit holds)."""
        if self.modality == "image":
            return self.image_tokens
        frames = self.max_audio_seconds * self.sampling_rate // self.hop_length
        if audio_samples is not None:
            frames = min(frames, max(1, math.ceil(audio_samples / self.hop_length)))
        # Qwen2AudioProcessor: a stride-2 convolution, then a stride-2 pooling.
        return (((frames - 1) // 2 + 1) - 2) // 2 + 1

    @property
    def max_audio_samples(self) -> int:
        return self.max_audio_seconds * self.sampling_rate


def media_layout(directory: Path) -> MediaLayout | None:
    """The layout of the model in `directory`; None for a text-only architecture.

    Raises LayoutUnavailable when the files cannot be read.
    """
    config = json_object(directory / "config.json")
    modality = ENGINE_MEDIA_ARCHITECTURES.get(str(config.get("model_type")))
    if modality is None:
        return None
    tokens = _added_tokens(directory)
    if modality == "image":
        token_id = int(config.get("image_token_index", config.get("image_token_id", -1)))
        vision = config.get("vision_config") or {}
        side = int(vision.get("image_size", 224)) // int(vision.get("patch_size", 14))
        extra = 0 if config.get("vision_feature_select_strategy", "default") == "default" else 1
        if not isinstance(config.get("vision_feature_layer", -2), int):
            raise LayoutUnavailable("several vision feature layers are not supported")
        return MediaLayout(
            "image", _token(tokens, token_id), token_id, image_tokens=side**2 + extra
        )
    token_id = int(config.get("audio_token_index", config.get("audio_token_id", -1)))
    extractor = _feature_extractor_config(directory)
    return MediaLayout(
        "audio",
        _token(tokens, token_id),
        token_id,
        sampling_rate=int(extractor.get("sampling_rate", 16_000)),
        hop_length=int(extractor.get("hop_length", 160)),
        max_audio_seconds=int(extractor.get("chunk_length", 30)),
    )


def json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; LayoutUnavailable when it cannot be read as one."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LayoutUnavailable(f"cannot read {path.name}") from exc
    if not isinstance(value, dict):
        raise LayoutUnavailable(f"{path.name} is not an object")
    return value


def _feature_extractor_config(directory: Path) -> dict[str, Any]:
    # transformers 5 nests it in processor_config.json; older saves have a file of its own.
    if (directory / "preprocessor_config.json").is_file():
        return json_object(directory / "preprocessor_config.json")
    nested = json_object(directory / "processor_config.json").get("feature_extractor")
    if not isinstance(nested, dict):
        raise LayoutUnavailable("the processor has no feature extractor")
    return nested


def _added_tokens(directory: Path) -> dict[int, str]:
    added = json_object(directory / "tokenizer.json").get("added_tokens") or []
    return {int(t["id"]): str(t["content"]) for t in added if isinstance(t, dict)}


def _token(tokens: dict[int, str], token_id: int) -> str:
    if token_id not in tokens:
        raise LayoutUnavailable("the media placeholder is not a token of the tokenizer")
    return tokens[token_id]
