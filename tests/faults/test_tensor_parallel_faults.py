"""A tensor-parallel engine whose follower rank is killed mid-run: real rank processes (gloo
on the CPU, the tiny model), as tests/inference/test_tensor_parallel.py starts them.

A rank killed during a forward makes the collective raise on the leader. Counted as each
request's own failure, every row in flight ended `internal_error`; the engine is broken
instead, and the requests it had not answered are left to the worker, which hands them back
to the queue (batches/execution: a broken engine's held items are released, not failed)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from inference.engine import EngineConfig, GenerationRequest, SamplingParams, load_model
from inference.engine.process import EngineProcess

pytestmark = pytest.mark.model


def test_a_follower_killed_mid_run_fails_no_request(tiny_model_dir: Path) -> None:
    tokenizer = load_model(str(tiny_model_dir), device="cpu")[1]
    engine = EngineProcess(
        load={"weights": str(tiny_model_dir), "device": "cpu"},
        config=EngineConfig(context_length=1024, max_batch_size=8),
        tokenizer=tokenizer,
        tensor_parallel_size=2,
    )
    try:
        prompt = tokenizer.encode("Tell me about the sea. " * 40, add_special_tokens=False)
        short = GenerationRequest("short", prompt, SamplingParams(max_new_tokens=2))
        long = [
            GenerationRequest(
                f"long{i}", prompt, SamplingParams(max_new_tokens=400, ignore_eos=True)
            )
            for i in range(7)
        ]
        follower = engine._followers[0][0]
        results = []
        for result in engine.generate(iter([short, *long])):
            results.append(result)
            if result.id == "short":
                # The long rows are decoding; a step is mostly its forward, so a kill a little
                # later most likely lands inside one (in a broadcast between steps, it was
                # always seen as a rank gone).
                threading.Timer(0.3, os.kill, (follower.pid, 9)).start()
        follower.join(timeout=10)

        assert [r.id for r in results] == ["short"] and results[0].error is None
        assert engine.broken  # the run ended as broken: the worker hands the rest back
    finally:
        engine.close()
