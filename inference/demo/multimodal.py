"""Tiny multimodal demo models: a LLaVA (images) and a Qwen2-Audio (audio), built offline.

Like the text demo (demo/model.py): random weights from a fixed seed, the demo's BPE tokenizer
with the media placeholder added as one special token, and a real transformers processor
(a PIL image processor, a Whisper feature extractor), so that media rows run end to end
through the real processor and model in tests and in the embedded demo. Each builds in a
fraction of a second and weighs well under a megabyte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inference.demo.model import (
    CHAT_TEMPLATE,
    CONTEXT_LENGTH,
    END_OF_TEXT,
    IM_END,
    MARKER,
    SIZES,
    build_atomically,
    build_tokenizer,
    sharpen_output_head,
)

BUILD_VERSION = 1
IMAGE_TOKEN = "<image>"  # noqa: S105 (a placeholder token, not a secret)
AUDIO_TOKEN = "<|AUDIO|>"  # noqa: S105 (a placeholder token, not a secret)

# The vision tower sees 30x30 pixels in 6x6 patches: 25 placeholder tokens per image (the
# "default" feature strategy drops the class token).
IMAGE_SIZE = 30
PATCH_SIZE = 6
# Whisper features: 80 mel bins, 10 ms hop at 16 kHz, 30 s windows; the encoder's positions
# must cover one window after its stride-2 convolution: 30·16000/160/2 = 1500.
SAMPLING_RATE = 16_000
HOP_LENGTH = 160
CHUNK_SECONDS = 30
MEL_BINS = 80

_SEED = 20261201

# The text demo's ChatML template, with the placeholder where a media part stands, for the
# tokenizer and the processor alike (one template: the web tier's token counts and the worker's
# prompts agree). Boardwalk's own rendering (inference/rendering.py) hands the template
# strings with the placeholder already in place.
_TEXT_PART = "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
if _TEXT_PART not in CHAT_TEMPLATE:  # the text demo's template changed: update this one
    raise RuntimeError("the demo chat template has no text-part branch to extend")
CHAT_TEMPLATE_WITH_MEDIA = CHAT_TEMPLATE.replace(
    _TEXT_PART,
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] in ('image', 'image_url') -%}{{- '" + IMAGE_TOKEN + "' -}}"
    "{%- elif part['type'] in ('audio', 'input_audio') -%}{{- '" + AUDIO_TOKEN + "' -}}"
    "{%- endif -%}",
)


def build_vision_model(out_dir: Path) -> Path:
    """Build the tiny LLaVA into `out_dir` (idempotent, atomic; see build_atomically)."""
    return build_atomically(out_dir, _build_vision, version=BUILD_VERSION)


def build_audio_model(out_dir: Path) -> Path:
    """Build the tiny Qwen2-Audio into `out_dir` (idempotent, atomic; see build_atomically)."""
    return build_atomically(out_dir, _build_audio, version=BUILD_VERSION)


def vision_revision_fields(path: Path) -> dict[str, Any]:
    """Fields for `revision_create(**fields)` serving the tiny LLaVA at `path`."""
    return _revision_fields("tiny-vision", path, "image")


def audio_revision_fields(path: Path) -> dict[str, Any]:
    """Fields for `revision_create(**fields)` serving the tiny Qwen2-Audio at `path`."""
    return _revision_fields("tiny-audio", path, "audio")


def _revision_fields(name: str, path: Path, modality: str) -> dict[str, Any]:
    return {
        "label": f"{name}@demo-v{BUILD_VERSION}",
        "weights": str(Path(path).resolve()),
        "context_length": CONTEXT_LENGTH,
        "dtype": "auto",
        "modalities": ["text", modality],
    }


def _text_fields(tokenizer: Any) -> dict[str, Any]:
    spec = SIZES["tiny"]
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "max_position_embeddings": CONTEXT_LENGTH,
        "bos_token_id": None,
        "eos_token_id": _eos_ids(tokenizer),
        "pad_token_id": tokenizer.convert_tokens_to_ids(END_OF_TEXT),
        "tie_word_embeddings": False,
    }


def _eos_ids(tokenizer: Any) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(END_OF_TEXT)]


def _build_vision(directory: Path) -> None:
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tokenizer = build_tokenizer(SIZES["tiny"].vocab_size, extra_specials=(IMAGE_TOKEN,))
    tokenizer.chat_template = CHAT_TEMPLATE_WITH_MEDIA
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        projection_dim=32,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=LlamaConfig(**_text_fields(tokenizer)),
        image_token_index=image_token_id,
        image_seq_length=(IMAGE_SIZE // PATCH_SIZE) ** 2,
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        tie_word_embeddings=False,
    )
    model = _seeded(lambda: LlavaForConditionalGeneration(config))
    # The PIL backend: the torchvision one is not installed (it breaks imports beside CPU torch).
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # the class token
        chat_template=CHAT_TEMPLATE_WITH_MEDIA,
    )
    _save(directory, model, processor, tokenizer, kind="vision")


def _build_audio(directory: Path) -> None:
    from transformers import (
        Qwen2AudioConfig,
        Qwen2AudioEncoderConfig,
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
        Qwen2Config,
        WhisperFeatureExtractor,
    )

    tokenizer = build_tokenizer(SIZES["tiny"].vocab_size, extra_specials=(AUDIO_TOKEN,))
    tokenizer.chat_template = CHAT_TEMPLATE_WITH_MEDIA
    audio_token_id = tokenizer.convert_tokens_to_ids(AUDIO_TOKEN)
    encoder = Qwen2AudioEncoderConfig(
        num_mel_bins=MEL_BINS,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=64,
        d_model=32,
        max_source_positions=CHUNK_SECONDS * SAMPLING_RATE // HOP_LENGTH // 2,
    )
    config = Qwen2AudioConfig(
        audio_config=encoder,
        text_config=Qwen2Config(**_text_fields(tokenizer), use_sliding_window=False),
        audio_token_index=audio_token_id,
    )
    model = _seeded(lambda: Qwen2AudioForConditionalGeneration(config))
    extractor = WhisperFeatureExtractor(
        feature_size=MEL_BINS,
        sampling_rate=SAMPLING_RATE,
        hop_length=HOP_LENGTH,
        chunk_length=CHUNK_SECONDS,
        n_fft=400,
    )
    processor = Qwen2AudioProcessor(
        feature_extractor=extractor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE_WITH_MEDIA,
        audio_token=AUDIO_TOKEN,
    )
    _save(directory, model, processor, tokenizer, kind="audio")


def _seeded(make: Any) -> Any:
    import torch

    # A private RNG stream: builds are reproducible and the caller's global RNG is untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        return make()


def _save(directory: Path, model: Any, processor: Any, tokenizer: Any, *, kind: str) -> None:
    from transformers import GenerationConfig

    sharpen_output_head(model, SIZES["tiny"].hidden_size)
    eos = _eos_ids(tokenizer)
    model.generation_config = GenerationConfig(
        eos_token_id=eos, pad_token_id=tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    )
    model.eval()
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    tokenizer.save_pretrained(directory, save_jinja_files=False)
    marker = {"kind": kind, "build_version": BUILD_VERSION, "seed": _SEED}
    (directory / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
