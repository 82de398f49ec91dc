"""The engine in its own process (inference/engine/process.py), on the real tiny model: the
same results as in the worker's process, failures contained there, a dead child reported."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from inference.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, load_model
from inference.engine.process import EngineProcess, EngineProcessError
from inference.engine.types import ConstraintSpec
from inference.rendering import render_prompt

pytestmark = pytest.mark.model

CONFIG = EngineConfig(context_length=2048, max_batch_size=4)


def greedy(tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path):
    return load_model(str(tiny_model_dir))


@pytest.fixture(scope="module")
def process(tiny_model_dir: Path, loaded):
    engine = EngineProcess(
        load={"weights": str(tiny_model_dir)}, config=CONFIG, tokenizer=loaded[1]
    )
    yield engine
    engine.close()


def requests(tokenizer, count: int, tokens: int = 12) -> list[GenerationRequest]:
    texts = ["Hi.", "Tell me about the sea. " * 4, "Why?", "A longer question, " * 7]
    return [
        GenerationRequest(
            str(i),
            render_prompt(tokenizer, [{"role": "user", "content": texts[i % 4]}]),
            greedy(tokens),
        )
        for i in range(count)
    ]


def test_results_equal_the_engine_in_this_process(process, loaded) -> None:
    model, tokenizer = loaded
    batch = requests(tokenizer, 9)  # more than the 4 rows: the child pulls as rows free up
    here = {r.id: r for r in Engine(model, tokenizer, CONFIG).generate(batch)}

    there = {r.id: r for r in process.generate(iter(batch))}

    assert process.max_batch_size == 4 and process.media_modalities == frozenset()
    assert set(there) == set(here)
    for rid, result in here.items():
        assert there[rid].choices[0].token_ids == result.choices[0].token_ids
        assert there[rid].choices[0].text == result.choices[0].text
        assert (there[rid].prompt_tokens, there[rid].completion_tokens) == (
            result.prompt_tokens,
            result.completion_tokens,
        )
        assert there[rid].busy_seconds > 0
    assert not process.broken


def test_a_request_that_fails_in_the_child_ends_alone_and_the_process_serves_on(
    process, loaded
) -> None:
    _, tokenizer = loaded
    batch = requests(tokenizer, 3)
    # A grammar nothing matches: this row's sampling raises, in the child, for this row only.
    batch[1].params = replace(batch[1].params, constraint=ConstraintSpec(grammar="%%% no grammar"))

    results = {r.id: r for r in process.generate(iter(batch))}

    assert results["1"].error == "internal_error" and results["1"].choices == []
    assert [results[i].completion_tokens for i in ("0", "2")] == [12, 12]
    assert not process.broken
    again = {r.id: r for r in process.generate(iter(requests(tokenizer, 2)))}
    assert sorted(again) == ["0", "1"] and not process.broken


def test_aborted_requests_come_back_aborted(process, loaded) -> None:
    _, tokenizer = loaded
    batch = requests(tokenizer, 6, tokens=1500)  # 4 rows running, 2 waiting: seconds of work
    began = time.monotonic()

    def aborted() -> set[str]:  # a cancel lands 0.3 s into the run
        return {r.id for r in batch} if time.monotonic() - began > 0.3 else set()

    results = list(process.generate(iter(batch), aborted=aborted))

    assert sorted(r.id for r in results) == [r.id for r in batch]
    assert all(r.aborted for r in results)
    assert not process.broken


def test_a_cancel_reaches_a_child_whose_inbox_is_full(tiny_model_dir: Path, loaded) -> None:
    # The child reads its pipe only between steps, so requests queue up in it: 64 prompts of
    # ~600 tokens are more than a pipe holds while its 4 rows run for seconds. The cancel
    # must still get through, and every result come back, without the run hanging on a send.
    _, tokenizer = loaded
    engine = EngineProcess(
        load={"weights": str(tiny_model_dir)},
        config=CONFIG,
        tokenizer=tokenizer,
        credit=64,
    )
    batch = requests(tokenizer, 64, tokens=1400)
    for request in batch:
        request.prompt_ids = (request.prompt_ids * 600)[:600]
    began = time.monotonic()

    def aborted() -> set[str]:
        return {r.id for r in batch} if time.monotonic() - began > 0.3 else set()

    results: list = []
    run = threading.Thread(
        target=lambda: results.extend(engine.generate(iter(batch), aborted=aborted)),
        daemon=True,
    )
    run.start()
    run.join(timeout=120)  # a hang guard, not a timing: the run takes about a second

    assert not run.is_alive()
    assert sorted(r.id for r in results) == sorted(r.id for r in batch)
    assert all(r.aborted for r in results)
    assert not engine.broken
    engine.close()


def test_the_child_dying_mid_run_ends_the_run_as_broken(tiny_model_dir: Path, loaded) -> None:
    _, tokenizer = loaded
    engine = EngineProcess(
        load={"weights": str(tiny_model_dir)}, config=CONFIG, tokenizer=tokenizer
    )
    pid = engine.pid
    assert pid is not None

    def source():
        yield from requests(tokenizer, 4, tokens=1500)
        os.kill(pid, signal.SIGKILL)  # the child is generating: kill -9 it (OOM killer)
        yield from requests(tokenizer, 1)

    began = time.monotonic()
    results = list(engine.generate(source()))

    assert results == []  # none of them could finish 1,500 tokens before the kill
    assert engine.broken
    assert time.monotonic() - began < 30  # seen dead within a poll, not waited on
    with pytest.raises(EngineProcessError):
        list(engine.generate(iter(requests(tokenizer, 1))))
    engine.close()


def test_weights_that_cannot_load_fail_the_start_with_the_loader_message(
    tmp_path: Path, loaded
) -> None:
    with pytest.raises(EngineProcessError, match="ModelLoadError"):
        EngineProcess(
            load={"weights": str(tmp_path / "missing")}, config=CONFIG, tokenizer=loaded[1]
        )


def test_an_orphaned_engine_process_drops_its_work_and_exits(tiny_model_dir: Path, loaded) -> None:
    """The worker dies mid-run (its end of the pipe closes): the child aborts what it holds
    instead of computing results for nobody on a device the next worker needs."""
    _, tokenizer = loaded
    long = replace(CONFIG, context_length=16_384)
    engine = EngineProcess(load={"weights": str(tiny_model_dir)}, config=long, tokenizer=tokenizer)
    closed = threading.Event()

    def source():
        # 8 requests reach the child (its credit): ~100k tokens, a minute of this model.
        yield from requests(tokenizer, 8, tokens=12_000)
        time.sleep(0.3)  # the child is generating
        engine._to_child.close()  # what the worker's death does to the pipe
        closed.set()

    results = list(engine.generate(source()))
    assert closed.wait(5)
    engine._process.join(timeout=15)  # far less than the work it held

    assert engine._process.exitcode == 0  # it left on its own, not killed
    assert results == [] and engine.broken


def test_the_child_steps_what_it_holds_while_the_next_request_is_not_there_yet(
    process, loaded
) -> None:
    """A request on its way must not hold up the rows the child already has: the second
    request is sent only once the first's result is back, which an engine that waits on its
    pipe for more requests (it has room for four) would never give."""
    _, tokenizer = loaded
    first, second = requests(tokenizer, 2, tokens=8)
    answered = threading.Event()
    order: list[str] = []

    def source():
        yield first
        order.append("first sent")
        answered.wait(timeout=60)
        order.append("second sent")
        yield second

    for result in process.generate(source()):
        order.append(f"result {result.id}")
        if result.id == first.id:
            answered.set()

    assert order == ["first sent", "result 0", "second sent", "result 1"]
    assert not process.broken
