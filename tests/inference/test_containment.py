"""Poison containment around an engine's generate and its core's step
(inference/engine/containment.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from inference.engine.containment import Contained
from inference.engine.types import (
    ERROR_INTERNAL,
    Choice,
    GenerationRequest,
    GenerationResult,
    PartialResult,
    SamplingParams,
)


class _Refusing:
    """An engine whose generate raises before it pulls anything (a wrong signature, say)."""

    tokenizer = None
    max_batch_size = 4
    media_modalities: frozenset[str] = frozenset()
    contains_failures = False
    broken = False
    calls = 0

    def generate(self, requests: Any, *, aborted: Any = None) -> Iterator[Any]:
        self.calls += 1
        raise TypeError("generate() got an unexpected keyword argument")

    def clear_prefix_cache(self) -> None:
        pass


def test_an_engine_that_raises_holding_no_request_is_broken_not_called_for_ever():
    engine = _Refusing()
    contained = Contained(engine)  # type: ignore[arg-type]
    request = GenerationRequest("r1", [1, 2, 3], SamplingParams(max_new_tokens=2))
    assert list(contained.generate(iter([request]))) == []
    assert contained.broken
    assert engine.calls == 1


class _Scripted:
    """An engine that streams `texts[id]` piece by piece, a piece a step, and raises at the
    step given by `poison` (a step of every request in the call: the poisoned request is
    the one in `poison`); alone, each request runs to its end unless it is the poison. Which
    pieces a run alone gives comes from `again` (default: the same as the first run)."""

    tokenizer = None
    max_batch_size = 4
    media_modalities: frozenset[str] = frozenset()
    contains_failures = False

    def __init__(self, texts: dict[str, list[str]], poison: str, again=None) -> None:
        self.texts, self.poison, self.again = texts, poison, again or texts
        self.calls = 0
        self.closed: list[str] = []  # requests whose run alone was left before its end

    def generate(self, requests: Any, *, aborted: Any = None):
        self.calls += 1
        pulled = list(requests)
        alone = self.calls > 1
        script = self.again if alone else self.texts
        ended = False
        try:
            for step in range(max((len(script[r.id]) for r in pulled), default=0)):
                for r in pulled:
                    if r.id == self.poison and (alone or step == 2):
                        raise RuntimeError("poison")
                    if step < len(script[r.id]):
                        yield PartialResult(r.id, 0, script[r.id][step])
            for r in pulled:
                text = "".join(script[r.id])
                yield GenerationResult(r.id, [Choice(0, [1], text, "stop")], 3, 1, 0, 0.0)
            ended = True
        finally:
            if alone and not ended:
                self.closed.extend(r.id for r in pulled)

    def clear_prefix_cache(self) -> None:
        pass


def _streamed(results: list[Any], rid: str) -> str:
    return "".join(r.text for r in results if isinstance(r, PartialResult) and r.id == rid)


def _requests() -> list[GenerationRequest]:
    params = SamplingParams(max_new_tokens=8)
    return [
        GenerationRequest("s", [1, 2], params, stream=True),
        GenerationRequest("p", [1, 2], params, stream=True),
    ]


def test_a_streamed_request_run_again_alone_is_not_streamed_twice():
    texts = {"s": ["Hel", "lo", " wor", "ld"], "p": ["a", "b", "c", "d"]}
    engine = _Scripted(texts, poison="p")
    contained = Contained(engine)  # type: ignore[arg-type]
    results = list(contained.generate(iter(_requests())))

    assert _streamed(results, "s") == "Hello world"  # "Hello" once, then the rest
    final = {r.id: r for r in results if isinstance(r, GenerationResult)}
    assert final["s"].error is None and final["s"].choices[0].text == "Hello world"
    assert final["p"].error == ERROR_INTERNAL
    assert engine.closed == ["p"]
    assert not contained.broken


def test_a_run_alone_that_departs_from_the_streamed_text_ends_as_internal_error():
    texts = {"s": ["Hel", "lo", " wor", "ld"], "p": ["a", "b", "c", "d"]}
    again = {"s": ["Hey", " there"], "p": texts["p"]}  # sampling drew otherwise
    engine = _Scripted(texts, poison="p", again=again)
    results = list(Contained(engine).generate(iter(_requests())))  # type: ignore[arg-type]

    assert _streamed(results, "s") == "Hello wor"  # nothing of the other text reached it
    final = {r.id: r for r in results if isinstance(r, GenerationResult)}
    assert final["s"].error == ERROR_INTERNAL and final["s"].choices == []
    assert engine.closed == ["s", "p"]  # its run was left at once, freeing its rows


class _Core:
    """An engine core with room for two requests in flight: a step finishes every request in
    flight, unless a poisoned one is among them, then it raises; alone (`generate`), each
    finishes and a poisoned one raises. `reset` answers the requests never admitted."""

    tokenizer = None
    max_batch_size = 2
    media_modalities: frozenset[str] = frozenset()
    contains_failures = False
    broken = False

    def __init__(self, poisoned: set[str]) -> None:
        self.poisoned = poisoned
        self.waiting: list[GenerationRequest] = []
        self.running: list[GenerationRequest] = []
        self.alone: list[str] = []

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: GenerationRequest) -> None:
        self.waiting.append(request)

    def abort(self, ids: Any) -> None:
        pass

    def step(self, **options: Any) -> list[GenerationResult]:
        while self.waiting and len(self.running) < 2:
            self.running.append(self.waiting.pop(0))
        if any(r.id in self.poisoned for r in self.running):
            raise RuntimeError("poison")
        done, self.running = self.running, []
        return [_done(r) for r in done]

    def reset(self) -> list[GenerationRequest]:
        unstarted, self.waiting, self.running = self.waiting, [], []
        return unstarted

    def generate(self, requests: Any, *, aborted: Any = None) -> Iterator[GenerationResult]:
        for request in requests:
            self.alone.append(request.id)
            if request.id in self.poisoned:
                raise RuntimeError("poison")
            yield _done(request)

    def clear_prefix_cache(self) -> None:
        pass


def _done(request: GenerationRequest) -> GenerationResult:
    return GenerationResult(request.id, [Choice(0, [1], "ok", "stop")], 2, 1, 0, 0.0)


def _four() -> list[GenerationRequest]:
    return [GenerationRequest(i, [1, 2], SamplingParams(max_new_tokens=1)) for i in "abcd"]


def test_a_step_that_raises_runs_its_requests_in_flight_alone_and_requeues_the_rest():
    core = _Core(poisoned={"b"})
    contained = Contained(core)  # type: ignore[arg-type]
    for request in _four():
        contained.add(request)

    first = contained.step()

    # a and b were in flight: each ran alone; b fails alone and ends as its own error.
    assert core.alone == ["a", "b"]
    assert [(r.id, r.error) for r in first] == [("a", None), ("b", ERROR_INTERNAL)]
    # c and d never ran: queued again as they were, and the next step finishes them.
    assert contained.has_unfinished and not contained.broken
    assert [(r.id, r.error) for r in contained.step()] == [("c", None), ("d", None)]
    assert not contained.has_unfinished


def test_a_step_whose_every_request_fails_alone_breaks_the_engine_and_keeps_the_rest_back():
    core = _Core(poisoned={"a", "b"})
    contained = Contained(core)  # type: ignore[arg-type]
    for request in _four():
        contained.add(request)

    results = contained.step()

    assert [(r.id, r.error) for r in results] == [("a", ERROR_INTERNAL), ("b", ERROR_INTERNAL)]
    assert contained.broken
    # Not queued again: the caller hands c and d back (their attempts are bounded there).
    assert not core.has_unfinished
