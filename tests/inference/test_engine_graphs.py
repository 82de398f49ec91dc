"""Decoding steps replayed from CUDA graphs (graphs.py): on by default on CUDA only, and on a
GPU token for token what the model generates unbatched. The GPU test is skipped without one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inference.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, load_model
from inference.engine.graphs import bucket, graphs_wanted
from inference.rendering import render_prompt


def test_graphs_are_wanted_on_cuda_only_unless_switched_off() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert graphs_wanted(cuda) and not graphs_wanted(cpu)
    assert graphs_wanted(cuda, True) and not graphs_wanted(cpu, True)
    assert not graphs_wanted(cuda, False)


def test_the_setting_reaches_the_engine(settings) -> None:
    from inference.models import ModelRevision
    from inference.runtime import _engine_config

    revision = ModelRevision(context_length=64, dialect="hermes")
    settings.ENGINE_CUDA_GRAPHS = False
    assert _engine_config(revision).cuda_graphs is False
    settings.ENGINE_CUDA_GRAPHS = True
    assert _engine_config(revision).cuda_graphs is True


def test_buckets_are_powers_of_two_holding_the_size() -> None:
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 64, 65, 256)] == [1, 2, 4, 4, 8, 64, 128, 256]


@pytest.mark.model
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_captured_decoding_equals_unbatched_generation(tiny_model_dir: Path) -> None:
    model, tokenizer = load_model(str(tiny_model_dir), device="cuda")
    prompts = [
        render_prompt(tokenizer, [{"role": "user", "content": f"Question {i} " * (1 + i % 5)}])
        for i in range(11)  # rows fall from 11 to 1 as they end: several buckets replayed
    ]
    engine = Engine(model, tokenizer, EngineConfig(context_length=512, max_batch_size=16))
    graphs = engine._runner._graphs
    assert graphs is not None
    requests = [
        GenerationRequest(
            str(i), p, SamplingParams(max_new_tokens=4 + 3 * i, temperature=0.0, ignore_eos=True)
        )
        for i, p in enumerate(prompts)
    ]
    results = {r.id: r for r in engine.generate(requests)}
    assert any(c is not None for c in graphs._captured.values())  # replayed, not all eager
    for i, p in enumerate(prompts):
        out = model.generate(
            torch.tensor([p], device="cuda"),
            attention_mask=torch.ones(1, len(p), dtype=torch.long, device="cuda"),
            max_new_tokens=4 + 3 * i,
            min_new_tokens=4 + 3 * i,
            do_sample=False,
        )
        assert results[str(i)].choices[0].token_ids == out[0, len(p) :].tolist(), i
