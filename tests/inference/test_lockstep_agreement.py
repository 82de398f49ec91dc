"""Tensor-parallel ranks agree on what wall-clock time decides (inference/engine/lockstep.py:
`agreement`), so batch is paced beside interactive requests and steady decoding takes
decoding runs on every rank, and the ranks' plans never part.

The ranks here are two engines on two copies of the real tiny model, in two threads of this
process, linked by an in-memory channel: the leader served by the engine child's own loop
(`process_child._serve`, fed through real pipes), the follower by `lockstep.follow`. Without
collectives between them, nothing but the broadcasts keeps them in step, so any decision a
follower took on its own clock would show as different outputs or a `LockstepBroken`."""

from __future__ import annotations

import multiprocessing
import queue
import threading
from pathlib import Path
from typing import Any

import pytest

from inference.engine import (
    Engine,
    EngineConfig,
    GenerationRequest,
    GenerationResult,
    load_model,
)
from inference.engine import runs as runs_module
from inference.engine.lockstep import Channel, LockstepBroken, agreement, follow
from inference.engine.process_child import _serve
from inference.engine.types import PartialResult
from tests.inference.requests_of import greedy, prompt


class Linked(Channel):
    """One end of an in-memory broadcast: the leader's messages reach the follower in order."""

    def __init__(self, rank: int, line: queue.Queue) -> None:
        super().__init__(group=None, rank=rank)
        self._line = line

    def share(self, message: Any = None) -> Any:
        if self.leader:
            self._line.put(message)
            return message
        return self._line.get(timeout=120)


def pair() -> tuple[Linked, Linked]:
    line: queue.Queue = queue.Queue()
    return Linked(0, line), Linked(1, line)


def test_the_leader_reads_and_the_follower_takes_its_reading() -> None:
    leader, follower = pair()
    lead, take = agreement(leader), agreement(follower)
    assert lead("spent", lambda: 0.25) == 0.25
    assert lead("run", lambda: True) is True

    def own_clock() -> float:
        raise AssertionError("a follower never reads its own clock")

    assert take("spent", own_clock) == 0.25
    assert take("run", own_clock) is True
    # A reading of another kind than the follower's engine asked for: the ranks parted.
    lead("now", lambda: 1.0)
    with pytest.raises(LockstepBroken, match="asked for 'spent' where the leader answered 'now'"):
        take("spent", own_clock)


class Kept(Engine):
    """An engine that keeps what its steps give (a follower's core discards them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept: list[GenerationResult | PartialResult] = []

    def step(self, **options: Any) -> list[GenerationResult | PartialResult]:
        outputs = super().step(**options)
        self.kept.extend(outputs)
        return outputs


def outputs_of(kept: list[GenerationResult | PartialResult]) -> list[tuple]:
    return [
        (o.id, o.text) if isinstance(o, PartialResult) else (o.id, [c.token_ids for c in o.choices])
        for o in kept
    ]


@pytest.mark.model
def test_paced_steps_and_decoding_runs_stay_in_step_on_every_rank(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[tuple[str, int]] = []
    end = runs_module.DecodeRun.end

    def logged(run: runs_module.DecodeRun) -> None:
        runs.append((threading.current_thread().name, len(run.tokens)))
        end(run)

    monkeypatch.setattr(runs_module.DecodeRun, "end", logged)
    # A step target no step meets: beside the chat, batch is held to the pacer's floor.
    config = EngineConfig(context_length=2048, max_batch_size=8, interactive_step_seconds=1e-9)
    leader_channel, follower_channel = pair()
    engines = []
    for channel in (leader_channel, follower_channel):
        model, tokenizer = load_model(str(tiny_model_dir), device="cpu")
        engines.append(Kept(model, tokenizer, config, agree=agreement(channel)))
    leader, follower = engines
    inbox, to_child = multiprocessing.Pipe(duplex=False)
    from_child, outbox = multiprocessing.Pipe(duplex=False)
    failures: list[BaseException] = []

    def run(name: str, body: Any) -> threading.Thread:
        def guarded() -> None:
            try:
                body()
            except BaseException as exc:  # the test reports it
                failures.append(exc)

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        return thread

    threads = [
        run("leader", lambda: _serve(leader, inbox, outbox, leader_channel)),
        run("follower", lambda: follow(follower, follower_channel)),
    ]
    # b0 ends early; the chat comes then, while the other rows decode (in a run or between).
    batch = [
        GenerationRequest(
            f"b{i}", prompt(tokenizer, f"Story number {i}, please."), greedy(4 if i == 0 else 48)
        )
        for i in range(8)
    ]
    chat = GenerationRequest(
        "chat", prompt(tokenizer, "Hello there!"), greedy(8), priority=1, stream=True
    )
    for request in batch:
        to_child.send(("add", request))
    results: dict[str, GenerationResult] = {}
    while len(results) < len(batch) + 1:
        kind, output = from_child.recv()
        if kind == "result":
            results[output.id] = output
            if output.id == "b0":
                to_child.send(("add", chat))
    to_child.send(("close",))  # the leader broadcasts it: the follower stops too
    for thread in threads:
        thread.join(timeout=60)

    assert not failures
    assert all(r.error is None and r.choices for r in results.values())
    # The follower took every step, run, partial text and result the leader took, alike.
    assert outputs_of(follower.kept) == outputs_of(leader.kept)
    assert follower.busy_seconds_total == leader.busy_seconds_total
    assert (follower._pacer.row_cap, follower._pacer.token_cap) == (
        leader._pacer.row_cap,
        leader._pacer.token_cap,
    )
    lead_runs = [taken for name, taken in runs if name == "leader"]
    assert lead_runs and lead_runs == [taken for name, taken in runs if name == "follower"]
    # Batch was paced beside the chat: its caps fell to the floor.
    assert leader._pacer.row_cap < config.max_batch_size
