"""Interactive requests through the engine's own process, on the real tiny model: they pass a
full child and its pipe of batch requests, and their partial text comes over the pipe."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest

from inference.engine import Engine, GenerationRequest, GenerationResult, SamplingParams, load_model
from inference.engine.process import EngineProcess
from inference.engine.types import PartialResult
from inference.rendering import render_prompt

pytestmark = pytest.mark.model

OPTIONS = {"context_length": 2048, "max_batch_size": 2}


def greedy(tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path):
    return load_model(str(tiny_model_dir))


def test_an_interactive_request_passes_the_batch_in_the_pipe_and_streams(
    tiny_model_dir: Path, loaded
) -> None:
    model, tokenizer = loaded

    def ids(text: str) -> list[int]:
        return render_prompt(tokenizer, [{"role": "user", "content": text}])

    batch = deque(
        GenerationRequest(f"b{i}", ids(f"Batch row {i}."), greedy(40), stream=i == 0)
        for i in range(8)
    )
    chat = GenerationRequest("i", ids("Hello!"), greedy(8), priority=1, stream=True)
    interactive: deque[GenerationRequest] = deque()
    sent = False

    def source() -> Iterator[GenerationRequest]:
        nonlocal sent
        while batch or not sent:
            if interactive:
                sent = True
                yield interactive.popleft()
            elif batch:
                yield batch.popleft()
            else:
                time.sleep(0.01)

    engine = EngineProcess(
        load={"weights": str(tiny_model_dir)}, engine_options=OPTIONS, tokenizer=tokenizer
    )
    try:
        order: list[str] = []
        partials: list[PartialResult] = []
        results: dict[str, GenerationResult] = {}
        for item in engine.generate(source(), urgent=lambda: bool(interactive)):
            if isinstance(item, PartialResult):
                partials.append(item)
                if len(partials) == 3:
                    # Both rows decode batch, two more wait in the child and one in the
                    # feeder, out of credit: nothing ends for some 35 steps.
                    interactive.append(chat)
                continue
            order.append(item.id)
            results[item.id] = item
    finally:
        engine.close()

    # The chat took a batch row and finished first.
    assert order[0] == "i" and len(order) == 9
    mine = [p for p in partials if p.id == "i"]
    assert mine and {p.id for p in partials} == {"b0", "i"}
    assert results["i"].choices[0].text.startswith("".join(p.text for p in mine))
    (alone,) = Engine(model, tokenizer, **OPTIONS).generate(
        [GenerationRequest("x", chat.prompt_ids, greedy(8))]
    )
    assert results["i"].choices[0].token_ids == alone.choices[0].token_ids
