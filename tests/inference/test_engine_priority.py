"""Two request classes on the real tiny model: interactive requests (priority 1) go ahead of
batch rows and take their rows, stream partial text, free their rows within a step when
aborted, and every step's busy time is shared out among both classes; in the engine's own
process too."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from inference.engine import (
    Engine,
    EngineConfig,
    GenerationRequest,
    GenerationResult,
)
from inference.engine.process import EngineProcess
from inference.engine.types import PartialResult
from tests.inference.requests_of import greedy, prompt

pytestmark = pytest.mark.model


class Arrivals:
    """What comes for an engine, as the worker's run would add it: batch rows in order while
    rows are free, interactive requests once they have arrived. Time is counted in ticks: one
    each time the engine's step asks whether something came (`arrived`, its `interrupt`), or
    when the engine holds nothing; the request of `later` (tick, request) arrives at that
    tick."""

    def __init__(
        self,
        batch: list[GenerationRequest],
        later: list[tuple[int, GenerationRequest]] = (),  # type: ignore[assignment]
    ) -> None:
        self.batch = deque(batch)
        self.later = sorted(later, key=lambda t: t[0])
        self.interactive: deque[GenerationRequest] = deque()
        self.ticks = 0

    def _tick(self) -> None:
        self.ticks += 1
        while self.later and self.later[0][0] <= self.ticks:
            self.interactive.append(self.later.pop(0)[1])

    def arrived(self) -> bool:
        self._tick()
        return bool(self.interactive)

    def drive(self, engine: Engine) -> Iterator[GenerationResult | PartialResult]:
        """The engine's outputs until everything that came was answered."""
        while True:
            while self.interactive:
                engine.add(self.interactive.popleft())
            while self.batch and engine.rows_in_use < engine.max_batch_size:
                engine.add(self.batch.popleft())
            if engine.has_unfinished:
                yield from engine.step(interrupt=self.arrived)
                self._tick()
            elif self.later:
                self._tick()
            else:
                return


def results_of(engine: Engine, source: Arrivals) -> list[GenerationResult]:
    items = list(source.drive(engine))
    assert all(isinstance(r, GenerationResult) for r in items)
    return items  # type: ignore[return-value]


def alone(engine: Engine, request: GenerationRequest) -> list[int]:
    (result,) = [
        r
        for r in engine.generate([replace(request, priority=0, stream=False)])
        if isinstance(r, GenerationResult)
    ]
    return result.choices[0].token_ids


def test_an_interactive_request_takes_a_batch_row_at_the_row_limit(loaded) -> None:
    model, tokenizer = loaded
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=2))
    batch = [
        GenerationRequest("b1", prompt(tokenizer, "Tell me about rivers."), greedy(24)),
        GenerationRequest("b2", prompt(tokenizer, "Why is the sky blue?"), greedy(24)),
    ]
    chat = GenerationRequest("i1", prompt(tokenizer, "Hello there!"), greedy(6), priority=1)
    # Both rows decode batch sequences when the chat arrives, a few steps in.
    results = results_of(engine, Arrivals(batch, [(4, chat)]))

    assert results[0].id == "i1"  # it did not wait for a batch row to finish
    by_id = {r.id: r for r in results}
    for request in [*batch, chat]:
        assert by_id[request.id].error is None
        assert by_id[request.id].choices[0].token_ids == alone(engine, request)


def test_several_interactive_requests_go_ahead_of_a_batch_backlog_token_exact(loaded) -> None:
    model, tokenizer = loaded
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=3))
    batch = [
        GenerationRequest(
            f"b{i}", prompt(tokenizer, f"Story number {i}, please."), greedy(16, n=1 + i % 2)
        )
        for i in range(5)
    ]
    chats = [
        GenerationRequest(f"i{i}", prompt(tokenizer, f"Quick question {i}?"), greedy(4), priority=1)
        for i in range(2)
    ]
    results = results_of(engine, Arrivals(batch, [(3, chats[0]), (5, chats[1])]))

    # The chats finish before any batch row, though every row was batch when they came.
    assert {r.id for r in results[:2]} == {"i0", "i1"}
    by_id = {r.id: r for r in results}
    assert set(by_id) == {r.id for r in [*batch, *chats]}
    for request in [*batch, *chats]:
        assert by_id[request.id].error is None
        for choice in by_id[request.id].choices:
            assert choice.token_ids == alone(engine, request)


def test_an_interactive_request_takes_memory_from_batch_sequences(loaded) -> None:
    """Rows are free but the blocks are not: batch sequences are parked, not the chat."""
    model, tokenizer = loaded
    engine = Engine(
        model,
        tokenizer,
        EngineConfig(context_length=2048, max_batch_size=4, block_size=16, max_num_blocks=12),
    )
    batch = [
        GenerationRequest(f"b{i}", prompt(tokenizer, f"Long essay {i} " * 4), greedy(40))
        for i in range(2)
    ]
    chat = GenerationRequest("i", prompt(tokenizer, "A quick one " * 4), greedy(8), priority=1)
    finished = results_of(engine, Arrivals(batch, [(3, chat)]))
    assert finished[0].id == "i"
    results = {r.id: r for r in finished}
    assert all(r.error is None for r in results.values())
    for request in [*batch, chat]:
        assert results[request.id].choices[0].token_ids == alone(engine, request)


def test_generate_never_pulls_past_its_rows(loaded) -> None:
    """A caller that pulls from a list: the engine asks it for no more than its rows."""
    model, tokenizer = loaded
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=3))
    pulled = 0

    def source() -> Iterator[GenerationRequest]:
        nonlocal pulled
        for i in range(9):
            pulled += 1
            yield GenerationRequest(str(i), prompt(tokenizer, "Hi " * i), greedy(3 + i % 3))

    stream = engine.generate(source())
    first = next(stream)
    assert pulled <= 3
    rest = list(stream)
    assert {r.id for r in [first, *rest]} == {str(i) for i in range(9)}


def test_a_streaming_request_yields_its_text_step_by_step(loaded) -> None:
    model, tokenizer = loaded
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=4))
    plain = GenerationRequest("s", prompt(tokenizer, "Say something."), greedy(12, n=2))
    streamed = replace(plain, id="t", stream=True, priority=1)
    items = list(engine.generate([plain, streamed]))

    final = {r.id: r for r in items if isinstance(r, GenerationResult)}
    partials = [p for p in items if isinstance(p, PartialResult)]
    assert all(p.id == "t" for p in partials)  # only the streaming request has partials
    assert items.index(final["t"]) > max(items.index(p) for p in partials)
    for index in (0, 1):
        text = "".join(p.text for p in partials if p.index == index)
        assert len([p for p in partials if p.index == index]) >= 2
        assert final["t"].choices[index].text.startswith(text) and text
        assert final["t"].choices[index].token_ids == final["s"].choices[index].token_ids


def test_streamed_text_never_shows_a_stop_string(loaded) -> None:
    model, tokenizer = loaded
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=2))
    ids = prompt(tokenizer, "Say something.")
    free = next(
        r
        for r in engine.generate([GenerationRequest("x", ids, greedy(16))])
        if isinstance(r, GenerationResult)
    )
    whole = free.choices[0].text
    stop = whole[len(whole) // 2 : len(whole) // 2 + 3]
    assert len(stop.strip()) == 3
    request = GenerationRequest(
        "s", ids, replace(greedy(16), stop=(stop,)), stream=True, priority=1
    )
    items = list(engine.generate([request]))
    result = items[-1]
    assert isinstance(result, GenerationResult)
    streamed = "".join(p.text for p in items if isinstance(p, PartialResult))
    assert result.choices[0].text == whole[: whole.find(stop)]
    assert result.choices[0].text.startswith(streamed)
    assert stop not in streamed


def test_an_aborted_stream_frees_its_row_within_one_step(loaded) -> None:
    model, tokenizer = loaded
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=1))
    chat = GenerationRequest(
        "i", prompt(tokenizer, "Talk for a long time."), greedy(200), stream=True, priority=1
    )
    waiting = GenerationRequest("b", prompt(tokenizer, "Then me."), greedy(4))
    gone: set[str] = set()
    after_abort: list[Any] = []
    for item in engine.generate([chat, waiting], aborted=lambda: gone):
        if gone:
            after_abort.append(item)
        elif isinstance(item, PartialResult) and len(item.text) and not gone:
            gone.add("i")  # the client disconnects after its first delta

    # The engine's poll interval is 0.5 s of work; a held interactive request is polled at
    # every step: the next thing yielded is its aborted result, no further partial.
    first = after_abort[0]
    assert isinstance(first, GenerationResult) and first.id == "i" and first.aborted
    rest = after_abort[1:]
    assert [r.id for r in rest] == ["b"]
    assert isinstance(rest[0], GenerationResult) and rest[0].completion_tokens == 4


def test_the_busy_shares_of_mixed_steps_add_up_to_their_busy_time(loaded) -> None:
    """Batch rows decode while a chat is prefilled and decodes beside them, a batch request
    is parked and computed again: every step's time is shared out among the sequences in
    it, whatever their class, and nothing else is charged."""
    model, tokenizer = loaded
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=2))
    batch = [
        GenerationRequest(f"b{i}", prompt(tokenizer, f"Batch {i}"), greedy(10, n=1 + i % 2))
        for i in range(3)
    ]
    chat = GenerationRequest("c", prompt(tokenizer, "Chat"), greedy(4), priority=1)
    before = engine.busy_seconds_total
    results = results_of(engine, Arrivals(batch, [(2, chat)]))

    assert len(results) == 4 and results[0].id == "c"
    shares = sum(r.busy_seconds for r in results)
    assert shares == pytest.approx(engine.busy_seconds_total - before, rel=1e-9)
    assert all(r.busy_seconds > 0 for r in results)


def test_an_interactive_request_passes_the_batch_in_the_pipe_and_streams(
    tiny_model_dir: Path, loaded
) -> None:
    model, tokenizer = loaded

    batch = deque(
        GenerationRequest(f"b{i}", prompt(tokenizer, f"Batch row {i}."), greedy(40), stream=i == 0)
        for i in range(8)
    )
    chat = GenerationRequest("i", prompt(tokenizer, "Hello!"), greedy(8), priority=1, stream=True)
    config = EngineConfig(context_length=2048, max_batch_size=2)
    engine = EngineProcess(
        load={"weights": str(tiny_model_dir)}, config=config, tokenizer=tokenizer
    )
    try:
        order: list[str] = []
        partials: list[PartialResult] = []
        results: dict[str, GenerationResult] = {}
        held = 0
        while len(results) < 9:
            while batch and held < engine.credit:  # as the worker's run: its credit's worth
                engine.add(batch.popleft())
                held += 1
            for item in engine.step(wait=0.05):
                if isinstance(item, PartialResult):
                    partials.append(item)
                    if len(partials) == 3:
                        # Both rows decode batch and two more wait in the child, its credit
                        # spent: nothing ends for some 35 steps. The chat goes past.
                        engine.add(chat)
                    continue
                held -= item.id != "i"
                order.append(item.id)
                results[item.id] = item
    finally:
        engine.close()

    # The chat took a batch row and finished first.
    assert order[0] == "i" and len(order) == 9
    mine = [p for p in partials if p.id == "i"]
    assert mine and {p.id for p in partials} == {"b0", "i"}
    assert results["i"].choices[0].text.startswith("".join(p.text for p in mine))
    here = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=2))
    assert results["i"].choices[0].token_ids == alone(here, chat)
