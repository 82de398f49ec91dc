"""The engine's verbs on the real tiny model: `add`, `abort` and `step` drive one scheduler for
the engine's life, give what `generate` gives, and leave no block held; `generate`, a loop
over them, leaves the engine reusable however it ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from inference.engine import (
    Engine,
    EngineConfig,
    GenerationRequest,
    GenerationResult,
)
from inference.engine.types import ERROR_CONTEXT_LENGTH, PartialResult
from tests.inference.requests_of import greedy, prompt

pytestmark = pytest.mark.model


def engine_of(loaded: Any, **options: Any) -> Engine:
    model, tokenizer = loaded
    return Engine(model, tokenizer, EngineConfig(context_length=512, **options))


def stepped(engine: Engine) -> dict[str, GenerationResult]:
    """Step until nothing is held; every result by id (each once)."""
    results: dict[str, GenerationResult] = {}
    while engine.has_unfinished:
        for output in engine.step():
            if isinstance(output, GenerationResult):
                assert output.id not in results
                results[output.id] = output
    return results


def all_blocks_back(engine: Engine) -> bool:
    return engine._blocks.available == engine._blocks.num_blocks - 1  # block 0: never handed out


def test_requests_stepped_to_the_end_equal_generate(loaded) -> None:
    tokenizer = loaded[1]
    requests = [
        GenerationRequest("short", prompt(tokenizer, "Hi."), greedy(5)),
        GenerationRequest("long", prompt(tokenizer, "Write a poem about the sea."), greedy(17)),
    ]
    engine = engine_of(loaded, max_batch_size=4)

    for request in requests:
        engine.add(request)
    results = stepped(engine)

    expected = {r.id: r for r in engine_of(loaded, max_batch_size=4).generate(requests)}
    assert set(results) == {"short", "long"}
    for rid, result in results.items():
        assert result.error is None and not result.aborted
        assert result.choices[0].token_ids == expected[rid].choices[0].token_ids
        assert result.completion_tokens == expected[rid].completion_tokens
    assert all_blocks_back(engine)


def test_an_aborted_request_comes_out_of_the_next_step_and_frees_its_blocks(loaded) -> None:
    tokenizer = loaded[1]
    engine = engine_of(loaded, max_batch_size=1)
    start = engine._blocks.available
    engine.add(GenerationRequest("running", prompt(tokenizer, "Tell me a story."), greedy(60)))
    engine.add(GenerationRequest("waiting", prompt(tokenizer, "Hi."), greedy(60)))
    for _ in range(4):
        assert engine.step() == []
    assert engine._blocks.available < start  # the running request holds blocks

    engine.abort(["running", "waiting", "never-added"])

    assert engine._blocks.available == start  # given back at once
    assert engine.has_unfinished  # their results wait for the step
    outputs = engine.step()
    assert [(r.id, r.aborted) for r in outputs if isinstance(r, GenerationResult)] == [
        ("running", True),
        ("waiting", True),
    ]
    running, waiting = outputs
    assert isinstance(running, GenerationResult) and isinstance(waiting, GenerationResult)
    assert running.completion_tokens == 4  # a token a step
    assert waiting.completion_tokens == 0  # never admitted (one row)
    assert not engine.has_unfinished
    assert engine._blocks.available == start
    assert engine.step() == []


def test_a_request_added_after_a_batch_finished_reads_its_prefix_from_the_cache(loaded) -> None:
    tokenizer = loaded[1]
    ids = prompt(tokenizer, "Explain lists and tuples in Python, please. " * 3)
    engine = engine_of(loaded, max_batch_size=2)
    scheduler = engine._scheduler
    engine.add(GenerationRequest("first", ids, greedy(6)))
    first = stepped(engine)["first"]

    engine.add(GenerationRequest("again", ids, greedy(6)))
    again = stepped(engine)["again"]

    assert engine._scheduler is scheduler  # one for the engine's life
    block = engine.block_size
    assert first.cached_tokens == 0
    assert again.cached_tokens == (len(ids) - 1) // block * block
    assert again.choices[0].token_ids == first.choices[0].token_ids
    assert all_blocks_back(engine)


def test_a_request_that_cannot_fit_comes_out_of_the_next_step_as_an_error(loaded) -> None:
    tokenizer = loaded[1]
    engine = engine_of(loaded)
    ids = prompt(tokenizer, "Hi.")
    engine.add(GenerationRequest("too-long", ids, greedy(512)))

    assert engine.has_unfinished  # its result waits for the step
    [result] = engine.step()

    assert isinstance(result, GenerationResult)
    assert result.id == "too-long" and result.error == ERROR_CONTEXT_LENGTH
    assert result.prompt_tokens == len(ids) and result.choices == []
    assert not engine.has_unfinished


def _requests(tokenizer: Any) -> list[GenerationRequest]:
    texts = ["Hi.", "Why is the sky blue?", "Name three rivers.", "Thanks!"]
    return [
        GenerationRequest(str(i), prompt(tokenizer, t), greedy(4 + 6 * i))
        for i, t in enumerate(texts)
    ]


def _ids(results: Iterator[GenerationResult | PartialResult]) -> dict[str, list[int]]:
    return {r.id: r.choices[0].token_ids for r in results if isinstance(r, GenerationResult)}


def test_generate_closed_early_leaves_the_engine_usable(loaded) -> None:
    requests = _requests(loaded[1])
    engine = engine_of(loaded, max_batch_size=2)
    expected = _ids(engine_of(loaded, max_batch_size=2).generate(requests))

    run = engine.generate(requests)
    first = next(run)
    assert isinstance(first, GenerationResult) and first.id == "0"
    assert not all_blocks_back(engine)  # the next requests are in flight
    run.close()

    assert all_blocks_back(engine) and not engine.has_unfinished
    assert _ids(engine.generate(requests)) == expected


def test_generate_whose_source_raises_leaves_the_engine_usable(loaded) -> None:
    requests = _requests(loaded[1])
    engine = engine_of(loaded, max_batch_size=4)

    def failing() -> Iterator[GenerationRequest]:
        yield from requests[:2]
        raise RuntimeError("the source broke")

    with pytest.raises(RuntimeError, match="the source broke"):
        list(engine.generate(failing()))

    assert all_blocks_back(engine) and not engine.has_unfinished
    engine.add(requests[3])
    assert list(stepped(engine)) == ["3"]


def test_a_call_abandoned_open_does_not_disturb_the_call_after_it(loaded) -> None:
    requests = _requests(loaded[1])
    engine = engine_of(loaded, max_batch_size=2)
    expected = _ids(engine_of(loaded, max_batch_size=2).generate(requests))
    abandoned = engine.generate(requests)
    next(abandoned)

    later = engine.generate(requests)  # takes the engine over
    first = next(later)
    abandoned.close()  # closes late (its finally runs): what `later` holds stays
    rest = list(later)

    assert _ids(iter([first, *rest])) == expected
    assert all_blocks_back(engine)
