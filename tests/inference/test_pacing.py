"""Batch yields step time to interactive requests: the pacer's caps follow the steps' measured
times, and on the real tiny model the batch rows held back beside a chat still produce what
they produce alone, and get their rows back once the chat is gone."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from inference.engine import (
    Engine,
    EngineConfig,
    GenerationRequest,
    GenerationResult,
    load_model,
    pacing,
)
from inference.engine.pacing import UNLIMITED, BatchAllowance, BatchPacer
from tests.inference.steps import steps_of
from tests.inference.test_engine_priority import Arrivals, greedy, prompt


def pacer(**options: Any) -> BatchPacer:
    return BatchPacer(0.05, **({"max_rows": 32, "max_tokens": 512, "block_size": 16} | options))


def test_nothing_is_held_back_without_interactive_requests() -> None:
    p = pacer()
    assert p.allowance(interactive=0, prefill=False, now=0.0) == UNLIMITED
    p.observe(1.0, batch_rows=32, batch_tokens=512)  # however slow the steps
    assert p.allowance(interactive=0, prefill=False, now=1.0) == UNLIMITED


def test_a_slow_step_shrinks_the_caps_in_proportion_and_fast_ones_let_them_grow_back() -> None:
    p = pacer()
    assert p.allowance(interactive=2, prefill=False, now=0.0) == BatchAllowance(32, 512)
    p.observe(0.1, batch_rows=30, batch_tokens=256)  # twice the target
    assert p.allowance(interactive=2, prefill=False, now=0.0) == BatchAllowance(15, 128)
    p.observe(0.01, batch_rows=15, batch_tokens=128)
    assert p.allowance(interactive=2, prefill=False, now=0.0) == BatchAllowance(16, 144)


def test_the_caps_keep_batch_advancing_however_slow_the_steps() -> None:
    p = pacer()
    for _ in range(20):
        p.observe(10.0, batch_rows=32, batch_tokens=512)
    # An eighth of the rows, and four blocks of prompt...
    assert p.allowance(interactive=1, prefill=False, now=0.0) == BatchAllowance(4, 64)
    # ...or as many batch rows as there are interactive ones, whichever is more.
    assert p.allowance(interactive=9, prefill=False, now=0.0) == BatchAllowance(9, 64)


def test_a_step_that_prefills_an_interactive_prompt_carries_a_quarter_and_no_batch_prompt():
    p = pacer()
    assert p.allowance(interactive=1, prefill=True, now=0.0) == BatchAllowance(8, 0)


def test_pacing_lingers_after_the_last_interactive_request_then_stops() -> None:
    p = pacer()
    p.allowance(interactive=1, prefill=False, now=10.0)
    lingering = p.allowance(interactive=0, prefill=False, now=10.0 + pacing.LINGER_SECONDS / 2)
    assert lingering.limited
    assert p.allowance(interactive=0, prefill=False, now=11.0 + pacing.LINGER_SECONDS) == (
        UNLIMITED
    )


def test_a_target_of_zero_turns_pacing_off() -> None:
    p = BatchPacer(0.0, max_rows=32, max_tokens=512, block_size=16)
    p.observe(10.0, batch_rows=32, batch_tokens=512)
    assert p.allowance(interactive=4, prefill=False, now=0.0) == UNLIMITED


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path):
    return load_model(str(tiny_model_dir))


def _run(engine: Engine, source: Arrivals) -> tuple[dict[str, GenerationResult], list]:
    """Results by id, and each step's (interactive rows, batch decoding rows)."""

    def summary(work) -> tuple[int, int]:
        interactive = sum(1 for seq, _ in work if seq.owner.priority > 0)
        return interactive, sum(1 for seq, t in work if seq.owner.priority <= 0 and t == 1)

    with steps_of(engine, summary) as steps:
        items = list(source.drive(engine))
    return {r.id: r for r in items if isinstance(r, GenerationResult)}, steps


@pytest.mark.model
def test_batch_rows_held_back_beside_a_chat_come_out_as_alone(loaded, monkeypatch) -> None:
    model, tokenizer = loaded
    monkeypatch.setattr(pacing, "LINGER_SECONDS", 0.0)
    # A target no step meets: beside the chat every batch row past the floor waits.
    engine = Engine(
        model,
        tokenizer,
        EngineConfig(context_length=2048, max_batch_size=8, interactive_step_seconds=1e-9),
    )
    batch = [
        GenerationRequest(f"b{i}", prompt(tokenizer, f"Story number {i}, please."), greedy(40))
        for i in range(8)
    ]
    chat = GenerationRequest("i1", prompt(tokenizer, "Hello there!"), greedy(8), priority=1)
    by_id, steps = _run(engine, Arrivals(batch, [(6, chat)]))

    beside = [b for i, b in steps if i]
    assert len(beside) == 8  # the chat's prefill, then a step for each of its 7 other tokens
    assert beside[0] == 2  # its prefill carries a quarter of the (7 left of 8) batch rows
    assert beside[1] == 7  # the first step after it: nothing learned yet
    # Then the floor, every step: one row (an eighth of the rows, and one chat), never none.
    assert beside[2:] == [1] * 6
    after = [b for i, b in steps[steps.index(next(s for s in steps if s[0])) :] if not i]
    assert max(after) > 1  # with the chat gone, batch takes its rows back
    for request in [*batch, chat]:
        assert by_id[request.id].error is None
        (alone,) = [
            r
            for r in engine.generate([replace(request, priority=0)])
            if isinstance(r, GenerationResult)
        ]
        assert by_id[request.id].choices[0].token_ids == alone.choices[0].token_ids


@pytest.mark.model
def test_without_pacing_batch_keeps_every_row_beside_a_chat(loaded) -> None:
    model, tokenizer = loaded
    engine = Engine(
        model,
        tokenizer,
        EngineConfig(context_length=2048, max_batch_size=8, interactive_step_seconds=0.0),
    )
    batch = [
        GenerationRequest(f"b{i}", prompt(tokenizer, f"Story number {i}, please."), greedy(40))
        for i in range(8)
    ]
    chat = GenerationRequest("i1", prompt(tokenizer, "Hello there!"), greedy(8), priority=1)
    _, steps = _run(engine, Arrivals(batch, [(6, chat)]))
    assert max(b for i, b in steps if i) == 7  # the chat took one row of eight
