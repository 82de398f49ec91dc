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
from batches.interactive.messages import Submitted, request_channel, requests_waiting
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
        put_first=taken.append,
    )
    yield feed
    feed.stop()


def _send(key: EngineKey) -> Submitted:
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
    )
    channels().push(request_channel(key), submitted.encode(), ttl=30)
    return submitted


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
