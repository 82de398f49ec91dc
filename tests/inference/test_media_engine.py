"""Media in the engine, on the tiny LLaVA and Qwen2-Audio: the same tokens as transformers'
own generate with the processor, chunked prefill, and prefix-cache keys that tell images apart."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
from django.core.management import call_command
from PIL import Image
from transformers import AutoModelForMultimodalLM, AutoProcessor

from boardwalk.errors import InvalidRequest
from inference.chat_completions import media_prompt, prompt_ids
from inference.demo.model import demo_revision_fields
from inference.demo.multimodal import vision_revision_fields
from inference.engine.config import EngineConfig
from inference.engine.engine import Engine
from inference.engine.loading import load_model, load_processor
from inference.engine.types import GenerationRequest, MediaInput, SamplingParams
from inference.media_decoding import decode_audio
from inference.media_layout import media_layout
from inference.models import ModelRevision
from inference.services import revision_create
from inference.tokenization import ChatTokenizer

PROMPT = "<|im_start|>user\nDescribe {token} please, the weather turned cold<|im_end|>\n"
PROMPT += "<|im_start|>assistant\n"


def _loaded(directory: Path) -> tuple[Any, Any]:
    processor = AutoProcessor.from_pretrained(directory, local_files_only=True)
    model = AutoModelForMultimodalLM.from_pretrained(directory, local_files_only=True).eval()
    return model, processor


def _images() -> list[Any]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)) for _ in range(3)]


def _clips() -> list[Any]:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(n) * 0.1).astype(np.float32) for n in (16_000, 24_000, 8_000)]


def _requests(directory: Path, processor: Any, values: list[Any]) -> tuple[list, list]:
    """Engine requests for `values`, and transformers' own greedy tokens for each."""
    layout = media_layout(directory)
    assert layout is not None
    text = PROMPT.format(token=layout.token)
    requests, expected = [], []
    model = AutoModelForMultimodalLM.from_pretrained(directory, local_files_only=True).eval()
    for i, value in enumerate(values):
        kind = {"image": "images", "audio": "audio"}[layout.modality]
        inputs = processor(text=[text], **{kind: [value]}, return_tensors="pt")
        ids = inputs["input_ids"][0].tolist()
        start = ids.index(layout.token_id)
        count = ids.count(layout.token_id)
        samples = len(value) if layout.modality == "audio" else None
        assert count == layout.placeholder_count(samples)  # the layout agrees with the processor
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
        expected.append(out[0, len(ids) :].tolist())
        media = MediaInput(
            layout.modality, value, hashlib.sha256(bytes([i])).digest(), start, count
        )
        params = SamplingParams(max_new_tokens=8, temperature=0, ignore_eos=True)
        requests.append(GenerationRequest(f"r{i}", ids, params, media=[media]))
    return requests, expected


@pytest.mark.parametrize("kind", ["vision", "audio"])
@pytest.mark.parametrize("step_tokens", [512, 7])
def test_media_rows_generate_what_transformers_generates(
    kind: str, step_tokens: int, vision_model_dir: Path, audio_model_dir: Path
):
    directory = vision_model_dir if kind == "vision" else audio_model_dir
    model, processor = _loaded(directory)
    values = _images() if kind == "vision" else _clips()
    requests, expected = _requests(directory, processor, values)
    # 7 tokens a step: every prompt is split across steps, mid-placeholders.
    engine = Engine(
        model,
        processor.tokenizer,
        EngineConfig(context_length=2048, max_batch_size=4, max_step_tokens=step_tokens),
        processor=processor,
    )
    results = {r.id: r for r in engine.generate(requests)}
    for i, want in enumerate(expected):
        got = results[f"r{i}"].choices[0].token_ids
        assert got == want[: len(got)] and got


def test_the_prefix_cache_tells_images_apart(vision_model_dir: Path):
    model, processor = _loaded(vision_model_dir)
    first, second, _ = _images()
    (request, other, _), _ = _requests(vision_model_dir, processor, [first, second, first])
    engine = Engine(
        model, processor.tokenizer, EngineConfig(context_length=2048), processor=processor
    )
    assert next(iter(engine.generate([request]))).cached_tokens == 0
    # Same tokens, another image: nothing after the image may come from the cache.
    swapped = GenerationRequest("swapped", request.prompt_ids, request.params, media=other.media)
    (start, length) = (request.media[0].start, request.media[0].length)
    assert next(iter(engine.generate([swapped]))).cached_tokens <= start // 16 * 16
    # The same image again: its blocks are reused.
    again = next(iter(engine.generate([request]))).cached_tokens
    assert again >= (start + length) // 16 * 16 > 0


def test_a_media_row_without_a_processor_is_refused(vision_model_dir: Path):
    model, processor = _loaded(vision_model_dir)
    (request, *_), _ = _requests(vision_model_dir, processor, _images()[:1])
    engine = Engine(model, processor.tokenizer, EngineConfig(context_length=2048))  # text only
    (result,) = engine.generate([request])
    assert result.error == "invalid_request"


def test_web_and_worker_lay_out_the_same_prompt_and_escape_quoted_placeholders(
    vision_model_dir: Path,
):
    layout = media_layout(vision_model_dir)
    assert layout is not None
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Is <image> a tag?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            }
        ]
    }
    web = prompt_ids(ChatTokenizer(vision_model_dir, media_layout=layout), body)
    _, tokenizer = load_model(str(vision_model_dir))
    worker = media_prompt(tokenizer, body, layout=layout, counts=[layout.image_tokens])
    assert web == worker.ids
    assert worker.ids.count(layout.token_id) == layout.image_tokens == 25
    assert worker.spans == [(worker.ids.index(layout.token_id), 25)]


def test_decoded_audio_is_resampled_to_the_feature_extractors_rate(audio_model_dir: Path):
    layout = media_layout(audio_model_dir)
    assert layout is not None and layout.sampling_rate == 16_000
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(44_100, dtype=np.float32), 44_100, format="WAV")
    samples = decode_audio(buffer.getvalue(), "wav", sampling_rate=16_000, max_seconds=30)
    assert samples.shape == (16_000,) and layout.placeholder_count(len(samples)) == 25
    assert load_processor(str(audio_model_dir)).feature_extractor.sampling_rate == 16_000


@pytest.mark.django_db
def test_a_revision_publishes_only_media_its_model_can_run(
    tiny_model_dir: Path, vision_model_dir: Path
):
    fields = demo_revision_fields(tiny_model_dir, "tiny")
    with pytest.raises(InvalidRequest) as refused:
        revision_create(**{**fields, "modalities": ["text", "image"]})
    assert refused.value.code == "unsupported_modality"
    with pytest.raises(InvalidRequest) as refused:
        revision_create(**{**fields, "modalities": ["text", "video"]})
    assert refused.value.code == "invalid_modalities"
    assert not ModelRevision.objects.exists()  # nothing was created by the refusals
    with pytest.raises(InvalidRequest):
        revision_create(**{**vision_revision_fields(vision_model_dir), "modalities": ["audio"]})
    assert revision_create(**vision_revision_fields(vision_model_dir)).modalities == [
        "text",
        "image",
    ]


def test_build_demo_model_builds_the_multimodal_models(tmp_path: Path):
    for flag, architecture in (("--vision", "llava"), ("--audio", "qwen2_audio")):
        out = io.StringIO()
        call_command("build_demo_model", flag, "--output", str(tmp_path / flag), stdout=out)
        directory = Path(out.getvalue().strip())
        layout = media_layout(directory)
        assert layout is not None and layout.modality in ("image", "audio")
        assert f'"model_type": "{architecture}"' in (directory / "config.json").read_text()
        assert sum(f.stat().st_size for f in directory.iterdir()) < 2_000_000
