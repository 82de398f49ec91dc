"""Decoding runs (runs.py): steps planned ahead give exactly the tokens that steps taken one at
a time give, end where a row ends, and give way within a step when something comes."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from inference.engine import (
    Engine,
    EngineConfig,
    GenerationRequest,
    SamplingParams,
)
from inference.engine import runner as runner_module
from inference.engine import runs as runs_module
from inference.engine.layout import PaddedSteps, padded_layout
from inference.engine.sampling import RunSampler, row_sampling, sample
from inference.rendering import render_prompt

pytestmark = pytest.mark.model


@pytest.fixture
def padded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding steps go padded (runs plan padded steps only; the tiny model at a few rows
    would pack them)."""
    monkeypatch.setattr(runner_module, "_decode_padded", lambda *args: True)


class RunLog:
    """Every run's planned steps and the steps it took."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.runs: list[tuple[int, int]] = []
        end = runs_module.DecodeRun.end

        def logged(run: runs_module.DecodeRun) -> None:
            self.runs.append((run.steps, len(run.tokens)))
            end(run)

        monkeypatch.setattr(runs_module.DecodeRun, "end", logged)


def _requests(tokenizer) -> list[GenerationRequest]:
    rng = random.Random(7)  # noqa: S311 (lengths, not secrets)
    requests = []
    for i in range(12):
        text = f"Tell me about bread number {i} " * (i % 3 + 1)
        ids = render_prompt(tokenizer, [{"role": "user", "content": text}])
        kind = i % 4
        if kind == 0:
            params = SamplingParams(max_new_tokens=rng.randint(20, 48), temperature=0.0)
        elif kind == 1:
            params = SamplingParams(
                max_new_tokens=rng.randint(5, 40), temperature=0.0, ignore_eos=True
            )
        elif kind == 2:
            params = SamplingParams(max_new_tokens=30, temperature=1.0, seed=i, n=2)
        else:
            params = SamplingParams(max_new_tokens=36, temperature=0.8, top_p=0.9, seed=i)
        requests.append(GenerationRequest(str(i), ids, params))
    return requests


def _outputs(engine: Engine, requests: list[GenerationRequest]) -> dict[str, list[list[int]]]:
    found = {}
    with torch.inference_mode():
        for result in engine.generate(iter(requests)):
            assert result.error is None, result.error
            found[result.id] = [c.token_ids for c in result.choices]
    return found


@pytest.mark.parametrize("max_num_blocks", [None, 40], ids=["roomy", "tight"])
def test_runs_give_the_tokens_of_single_steps_and_end_where_a_row_ends(
    loaded, padded, monkeypatch: pytest.MonkeyPatch, max_num_blocks: int | None
) -> None:
    model, tokenizer = loaded
    requests = _requests(tokenizer)

    def engine(eos: set[int] | None = None) -> Engine:
        return Engine(
            model,
            tokenizer,
            EngineConfig(
                context_length=2048,
                max_batch_size=4,
                eos_token_ids=eos,
                max_num_blocks=max_num_blocks,
            ),
        )

    # A token the model often generates ends rows (as if it were end-of-sequence), so that
    # runs end early, mid-run, while seeded rows in them go on.
    with monkeypatch.context() as off:
        off.setattr(runs_module, "MAX_RUN_STEPS", 1)
        plain = _outputs(engine(), requests)
        common = Counter(t for choices in plain.values() for c in choices for t in c[2:])
        eos = {common.most_common(1)[0][0]}
        single = _outputs(engine(eos), requests)
    log = RunLog(monkeypatch)
    ahead = _outputs(engine(eos), requests)

    assert ahead == single
    assert sum(taken for _, taken in log.runs) >= 40  # most decoding steps were run ahead
    assert any(taken < planned for planned, taken in log.runs)  # ended by a row's end
    ended = [c for choices in ahead.values() for c in choices if c[-1] in eos]
    assert ended  # and those rows stopped at that token


def test_a_run_gives_way_within_a_step_when_something_comes(loaded, padded, monkeypatch) -> None:
    model, tokenizer = loaded
    log = RunLog(monkeypatch)
    forwards = [0]
    hook = model.register_forward_hook(lambda *args: forwards.__setitem__(0, forwards[0] + 1))
    ids = render_prompt(tokenizer, [{"role": "user", "content": "Rye or wheat?"}])
    batch = SamplingParams(max_new_tokens=60, ignore_eos=True)
    arrival = 12  # an interactive request comes at this forward, mid-run
    added_at: list[int] = []
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=4))
    for i in range(4):
        engine.add(GenerationRequest(f"b{i}", ids, batch))
    results = {}
    try:
        with torch.inference_mode():
            while engine.has_unfinished:
                for output in engine.step(interrupt=lambda: forwards[0] >= arrival):
                    results[output.id] = output
                if forwards[0] >= arrival and not added_at:
                    added_at.append(forwards[0])
                    engine.add(
                        GenerationRequest("chat", ids, SamplingParams(max_new_tokens=4), priority=1)
                    )
    finally:
        hook.remove()

    assert all(r.error is None for r in results.values()) and "chat" in results
    assert any(taken > 1 for _, taken in log.runs)
    assert added_at[0] <= arrival + 1


def test_each_step_of_the_padded_layouts_equals_a_fresh_layout() -> None:
    bs = 4
    table = torch.tensor([[3, 7, 9, 12], [5, 6, 0, 0], [8, 10, 11, 13]])
    lengths = torch.tensor([6, 3, 9])  # after the first step; the widest enters blocks 3, 4
    steps = PaddedSteps(table, block_size=bs, windowed=True)
    for step in range(6):
        now = lengths + step
        width = -(-int(now.max()) // bs)
        got = steps.at(now, width)
        want = padded_layout(table[:, :width], now, block_size=bs, windowed=True)
        for name in ("read", "write", "positions", "allowed", "q_pos", "k_pos"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (step, name)


def test_a_run_samples_what_sample_would_and_rewinds_generators_it_did_not_use() -> None:
    vocab = 50
    eos = [3]

    def rows():
        params = [
            SamplingParams(8, temperature=0.0),
            SamplingParams(8, temperature=0.0, ignore_eos=True),
            SamplingParams(8, temperature=1.0, seed=11),
            SamplingParams(8, temperature=0.7, top_p=0.8, seed=12, ignore_eos=True),
        ]
        return [
            row_sampling(p, choice=0, eos_ids=eos, vocab_size=vocab, device=torch.device("cpu"))
            for p in params
        ]

    logits = [torch.randn(4, vocab, generator=torch.Generator().manual_seed(s)) for s in range(5)]
    one_by_one, ahead = rows(), rows()
    sampler = RunSampler(ahead, 8, torch.device("cpu"))
    for step in range(3):  # a run of 8 planned steps that ended after 3
        expected = sample(logits[step].clone(), one_by_one, [[]] * 4)
        assert sampler.choose(logits[step].clone(), step).tolist() == expected
    sampler.rewind(3)
    for step in (3, 4):  # single steps after it draw as if there had been no run
        assert sample(logits[step].clone(), ahead, [[]] * 4) == sample(
            logits[step].clone(), one_by_one, [[]] * 4
        )


def test_a_run_stops_when_the_abort_poll_is_due(loaded, padded, monkeypatch) -> None:
    model, tokenizer = loaded
    forwards = [0]
    hook = model.register_forward_hook(lambda *args: forwards.__setitem__(0, forwards[0] + 1))
    ids = render_prompt(tokenizer, [{"role": "user", "content": "Rye or wheat?"}])
    batch = SamplingParams(max_new_tokens=60, ignore_eos=True)
    requests = [GenerationRequest(f"b{i}", ids, batch) for i in range(4)]
    gone = 12  # the client of b0 goes away at this forward, mid-run
    seen_at: dict[str, int] = {}
    # A poll due after any work at all: every run ends after its first step.
    engine = Engine(
        model,
        tokenizer,
        EngineConfig(context_length=2048, max_batch_size=4, abort_poll_seconds=1e-9),
    )
    try:
        with torch.inference_mode():
            for result in engine.generate(
                iter(requests), aborted=lambda: {"b0"} if forwards[0] >= gone else set()
            ):
                seen_at[result.id] = forwards[0]
                assert result.aborted == (result.id == "b0")
    finally:
        hook.remove()

    assert seen_at["b0"] <= gone + 1
