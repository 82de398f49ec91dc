"""Fresh batch prompts start together: while rows are decoding, a batch sequence that has
computed nothing waits (a few steps at most) for others, so one prompt forward starts several
of them; what each request generates does not change."""

from __future__ import annotations

import pytest

from inference.engine import Engine, EngineConfig, GenerationRequest, GenerationResult
from inference.engine import planning as planning_module
from tests.inference.steps import steps_of
from tests.inference.test_engine_priority import greedy, prompt

pytestmark = pytest.mark.model


def _backlog(tokenizer) -> list[GenerationRequest]:
    # Lengths that differ, so rows finish (and free up) a few at a time.
    return [
        GenerationRequest(
            f"r{i}", prompt(tokenizer, f"Note {i}: say something."), greedy(3 + i % 7)
        )
        for i in range(96)
    ]


def _run(engine: Engine, requests: list[GenerationRequest]) -> tuple[dict[str, list[int]], list]:
    """Tokens by id, and each step's (decoding rows, fresh prompts started)."""

    def summary(work) -> tuple[int, int]:
        decoding = sum(1 for _, take in work if take == 1)
        return decoding, sum(1 for seq, take in work if take > 1 and seq.computed == 0)

    with steps_of(engine, summary) as steps:
        results = [r for r in engine.generate(requests) if isinstance(r, GenerationResult)]
    return {r.id: r.choices[0].token_ids for r in results}, steps


def test_fresh_batch_prompts_start_together_and_generate_the_same(loaded, monkeypatch) -> None:
    model, tokenizer = loaded
    requests = _backlog(tokenizer)

    def engine() -> Engine:
        return Engine(
            model,
            tokenizer,
            EngineConfig(context_length=2048, max_batch_size=32, prefix_cache=False),
        )

    gathered, steps = _run(engine(), requests)
    monkeypatch.setattr(planning_module, "GATHER_STEPS", 0)
    alone, before = _run(engine(), requests)

    assert gathered == alone
    starts = [fresh for decoding, fresh in steps if decoding and fresh]
    starts_before = [fresh for decoding, fresh in before if decoding and fresh]
    # Beside decoding rows, fewer prompt forwards start more prompts each.
    assert len(starts) < len(starts_before)
    assert sum(starts) / len(starts) > sum(starts_before) / len(starts_before)
    assert sum(starts) == sum(starts_before)  # every request still started exactly once
