from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from transformers import AutoModelForCausalLM, AutoTokenizer

from inference.demo.model import CONTEXT_LENGTH, MARKER, build_demo_model, demo_revision_fields
from inference.models import ModelRevision


def test_tiny_model_loads_with_auto_classes_offline(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)

    assert model.config.model_type == "llama"
    assert model.config.max_position_embeddings == CONTEXT_LENGTH
    assert model.config.vocab_size == len(tokenizer)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    assert {"<|im_start|>", "<|im_end|>"} <= set(tokenizer.all_special_tokens)
    # The template travels inside tokenizer_config.json, not as a separate jinja file.
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in config["chat_template"]


def test_chat_template_renders_chatml_for_every_role(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "No emoji."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
        },
        {"role": "assistant", "content": "Hello."},
        {"role": "tool", "content": "42"},
    ]

    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>developer\nNo emoji.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>tool\n42<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without = tokenizer.apply_chat_template(messages[:1], tokenize=False)
    assert without == "<|im_start|>system\nBe brief.<|im_end|>\n"


def test_build_is_idempotent_and_reproducible(tiny_model_dir: Path, tmp_path: Path) -> None:
    stamp = (tiny_model_dir / MARKER).stat().st_mtime_ns

    assert build_demo_model(tiny_model_dir, size="tiny") == tiny_model_dir
    assert (tiny_model_dir / MARKER).stat().st_mtime_ns == stamp

    again = build_demo_model(tmp_path / "again", size="tiny")
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_model_dir / name).read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["again"]  # no temporary directory left


def test_build_refuses_a_directory_that_is_not_a_finished_build(tmp_path: Path) -> None:
    (tmp_path / "half").mkdir()

    with pytest.raises(FileExistsError):
        build_demo_model(tmp_path / "half")
    with pytest.raises(ValueError, match="size"):
        build_demo_model(tmp_path / "other", size="huge")


def test_revision_fields_fit_the_model_revision_table(tiny_model_dir: Path) -> None:
    fields = demo_revision_fields(tiny_model_dir, "tiny")

    columns = {f.name for f in ModelRevision._meta.get_fields()}
    assert set(fields) <= columns
    assert fields["weights"] == str(tiny_model_dir.resolve())
    assert fields["context_length"] == CONTEXT_LENGTH
    assert fields["modalities"] == ["text"]


def test_management_command_builds_into_the_output_dir_and_prints_it(tmp_path: Path) -> None:
    out = io.StringIO()

    call_command("build_demo_model", "--size", "tiny", "--output", str(tmp_path / "m"), stdout=out)

    assert out.getvalue().strip() == str(tmp_path / "m")
    assert (tmp_path / "m" / MARKER).is_file()


def test_the_1b_size_has_the_shape_of_a_1b_llama() -> None:
    # Counted on the meta device: the GPU benchmark's model, without building its weights here.
    import torch
    from transformers import LlamaForCausalLM

    from inference.demo.model import SIZES, llama_config

    spec = SIZES["1b"]
    config = llama_config(spec, vocab_size=spec.vocab_size)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    assert 0.9e9 < params < 1.1e9
    assert spec.num_attention_heads // spec.num_key_value_heads == 4  # grouped-query attention
