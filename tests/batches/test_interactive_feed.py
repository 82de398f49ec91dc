"""The worker's interactive feed and the end of its run: a request is either taken by a run
that stays up for it, or left in the channel for the next run, never taken by a run that is
ending (which answered it with internal_error: seen in CI, where the first request of a run
woken for it was popped just as the run decided nothing was lingering)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from batches.interactive import feed as feed_module
from batches.interactive.feed import InteractiveFeed
from batches.interactive.messages import (
    WANTED_GAUGE,
    Submitted,
    abort_flag,
    decode_reply,
    feed_alive_flag,
    listener_flag,
    reply_channel,
    request_channel,
    requests_waiting,
    wanted_field,
)
from batches.queue import EngineKey
from boardwalk.channels import channels
from inference.engine.types import GenerationRequest


@pytest.fixture
def key() -> Iterator[EngineKey]:
    key = EngineKey(f"rev_feed{uuid.uuid4().hex[:8]}", "")
    yield key
    channels().delete(request_channel(key))


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[GenerationRequest]:
    # The engine's tokenizer is not what is under test: any prompt ids will do.
    monkeypatch.setattr(feed_module, "bounded_prompt_ids", lambda *a, **k: [1, 2, 3])
    return []


@pytest.fixture
def feed(key: EngineKey, taken: list[GenerationRequest], settings) -> Iterator[InteractiveFeed]:
    settings.INTERACTIVE_LINGER_SECONDS = 0.0  # only what is in flight or waiting counts
    feed = InteractiveFeed(
        key,
        tokenizer=None,
        context_length=64,
        max_rows=4,
        engine_rows=lambda: 0,
        submit=taken.append,
    )
    yield feed
    feed.stop()


def _send(
    key: EngineKey, *, listening: bool = True, prompt_ids: list[int] | None = None
) -> Submitted:
    """Push a request as the web tier does (relay.dispatch), its listener flag raised."""
    submitted = Submitted(
        id=f"req_{uuid.uuid4().hex}",
        org_id="org_feed",
        deployment_id="",
        body={
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 2,
        },
        stream=False,
        deadline=time.time() + 30,
        prompt_ids=prompt_ids,
    )
    if listening:
        channels().flag(listener_flag(submitted.id), ttl=30)
    channels().push(request_channel(key), submitted.encode(), ttl=30)
    return submitted


def _until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_request_popped_while_the_run_decides_to_end_keeps_the_run(
    feed: InteractiveFeed, key: EngineKey, taken: list[GenerationRequest], monkeypatch
):
    popped, release = threading.Event(), threading.Event()
    decode = Submitted.decode

    def slow_decode(raw: bytes) -> Submitted:
        popped.set()  # out of the channel, not in flight yet
        release.wait(10)
        return decode(raw)

    monkeypatch.setattr(Submitted, "decode", staticmethod(slow_decode))
    feed.start()
    submitted = _send(key)
    assert popped.wait(10)
    assert not requests_waiting(key)

    answers: list[bool] = []
    decider = threading.Thread(target=lambda: answers.append(feed.lingering()))
    decider.start()
    decider.join(0.3)
    assert decider.is_alive()  # it waits for the pop under way, not answering "nothing here"
    release.set()
    decider.join(10)

    assert answers == [True]
    assert [r.id for r in taken] == [submitted.generation_id]
    assert feed.owns(submitted.generation_id)


def test_once_the_run_ends_the_feed_leaves_requests_for_the_next(
    feed: InteractiveFeed, key: EngineKey, taken: list[GenerationRequest]
):
    feed.start()
    assert feed.lingering() is False  # nothing in flight, waiting or recent: the run ends

    _send(key)
    feed._thread.join(10)  # the feed stops popping once told the run ends

    assert not feed._thread.is_alive()
    assert taken == []
    assert requests_waiting(key)  # still there for the next run's feed


def test_an_empty_message_is_refused_and_the_feed_takes_the_next_request(
    feed: InteractiveFeed, key: EngineKey, taken: list[GenerationRequest]
):
    feed.start()
    channels().push(request_channel(key), b"{}", ttl=30)  # no envelope at all
    submitted = _send(key)

    assert _until(lambda: taken)
    assert [r.id for r in taken] == [submitted.generation_id]
    assert feed._thread.is_alive()


def test_a_replayed_request_message_runs_once(
    feed: InteractiveFeed, key: EngineKey, taken: list[GenerationRequest]
):
    submitted = _send(key)
    raw = submitted.encode()
    feed.start()
    assert _until(lambda: taken)
    channels().push(request_channel(key), raw, ttl=30)  # the same sealed message again
    assert _until(lambda: not requests_waiting(key))
    time.sleep(0.3)  # a second take would follow the pop at once

    assert [r.id for r in taken] == [submitted.generation_id]
    assert feed.taken == 1


def test_a_request_nobody_listens_to_is_not_taken(
    feed: InteractiveFeed, key: EngineKey, taken: list[GenerationRequest]
):
    feed.start()
    _send(key, listening=False)  # its web process died before the worker popped it
    assert _until(lambda: not requests_waiting(key))
    time.sleep(0.3)

    assert taken == []


class FlakyChannels:
    """The process's channels, failing every call while `down` is set (a broker outage)."""

    def __init__(self, real) -> None:
        self.real = real
        self.down = threading.Event()

    def __getattr__(self, name: str):
        attribute = getattr(self.real, name)

        def call(*args, **kwargs):
            if self.down.is_set():
                raise ConnectionError("broker down")
            return attribute(*args, **kwargs)

        return call


def test_the_feed_survives_a_broker_outage_and_takes_requests_after_it(
    feed: InteractiveFeed, key: EngineKey, taken: list[GenerationRequest]
):
    flaky = FlakyChannels(feed.channels)
    feed.channels = flaky  # type: ignore[assignment]
    flaky.down.set()
    feed.start()
    time.sleep(1.0)  # several failed pops and reports
    assert feed._thread.is_alive()
    flaky.down.clear()
    submitted = _send(key)

    assert _until(lambda: taken, seconds=5)  # back within its longest pause (2 s)
    assert [r.id for r in taken] == [submitted.generation_id]
    assert channels().flagged([feed_alive_flag(feed.reporter)])


def test_a_request_is_aborted_when_its_flag_rises_or_its_listener_lapses(
    feed: InteractiveFeed, key: EngineKey, taken: list[GenerationRequest]
):
    feed.start()
    closed, crashed, alive = _send(key), _send(key), _send(key)
    assert _until(lambda: len(taken) == 3)

    channels().flag(abort_flag(closed.id), ttl=30)  # its client closed the stream
    channels().flag(listener_flag(crashed.id), ttl=0.001)  # its web process died
    channels().flag(listener_flag(alive.id), ttl=30)

    assert _until(lambda: len(feed.aborted()) == 2, seconds=5)
    assert feed.aborted() == {closed.generation_id, crashed.generation_id}


def test_a_request_whose_reply_cannot_be_delivered_is_aborted_at_once(
    feed: InteractiveFeed, key: EngineKey, taken: list[GenerationRequest]
):
    from inference.engine.types import PartialResult

    feed.start()
    submitted = _send(key)
    assert _until(lambda: taken)
    streamed = Submitted(**{**submitted.__dict__, "stream": True})
    with feed._lock:
        feed._inflight[submitted.generation_id] = streamed
    flaky = FlakyChannels(feed.channels)
    feed.channels = flaky  # type: ignore[assignment]
    flaky.down.set()

    feed.partial(PartialResult(submitted.generation_id, 0, "text"))

    assert submitted.generation_id in feed.aborted()
    flaky.down.clear()


def test_lingering_gives_the_worker_up_to_another_models_waiting_request(
    feed: InteractiveFeed, key: EngineKey, settings
):
    settings.INTERACTIVE_LINGER_SECONDS = 60.0
    feed._last = time.monotonic()  # it served a request a moment ago
    other = EngineKey(f"rev_other{uuid.uuid4().hex[:8]}", "")
    try:
        assert feed.lingering() is True  # nothing else wants the worker: it keeps the engine

        channels().gauge(WANTED_GAUGE, wanted_field(other), 1, ttl=30)
        _send(other)  # another model's request waits, popped by nobody

        assert feed.lingering() is False
    finally:
        channels().delete(request_channel(other))


def test_the_worker_generates_from_the_ids_the_web_process_counted(
    feed: InteractiveFeed, key: EngineKey, taken: list[GenerationRequest], monkeypatch
):
    """Tokenized once: the web process's ids reach the engine, the worker renders nothing."""

    def tokenized_again(*args, **kwargs):
        raise AssertionError("the worker tokenized a prompt the web process had counted")

    monkeypatch.setattr(feed_module, "bounded_prompt_ids", tokenized_again)
    feed.start()
    _send(key, prompt_ids=[7, 8, 9])
    assert _until(lambda: taken)
    assert taken[0].prompt_ids == [7, 8, 9]


def test_ids_past_the_workers_context_are_refused_not_generated(
    feed: InteractiveFeed, key: EngineKey, taken: list[GenerationRequest]
):
    feed.start()
    submitted = _send(key, prompt_ids=list(range(65)))  # the feed's context: 64 tokens
    assert _until(lambda: not requests_waiting(key))
    reply = channels().pop(reply_channel(submitted.id), timeout=5)
    assert reply is not None
    assert decode_reply(submitted, reply) == {"kind": "error", "code": "context_length_exceeded"}
    assert taken == []
