"""Idle Redis consumers wake when a message is enqueued, not at their next poll
(boardwalk.broker.DoorbellRedisBroker). Needs a real Redis: runs where REDIS_URL is set."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis

from boardwalk.broker import DOORBELL_RINGS, DoorbellRedisBroker

pytestmark = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL")

POLL_MS = 600_000  # ten minutes: a consumer that only polled would not see the message


@pytest.fixture
def broker() -> Iterator[DoorbellRedisBroker]:
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    broker = DoorbellRedisBroker(client=client, namespace=f"doorbell-test-{uuid.uuid4().hex}")
    broker.declare_queue("work")
    yield broker
    broker.flush_all()
    client.delete(broker.doorbell("work"))


def _message(queue: str = "work") -> dramatiq.Message[Any]:
    return dramatiq.Message(queue_name=queue, actor_name="job", args=(), kwargs={}, options={})


def _take(consumer: Any, got: list[Any], stop: threading.Event) -> None:
    while not stop.is_set():
        message = next(consumer)
        if message is not None:
            got.append(message)
            return


def test_an_idle_consumer_takes_a_message_while_its_poll_is_still_asleep(
    broker: DoorbellRedisBroker,
) -> None:
    consumer = broker.consume("work", prefetch=1, timeout=POLL_MS)
    consumer.misses = 30  # past the backoff's ramp: every empty fetch waits the whole poll
    got: list[Any] = []
    stop = threading.Event()
    waiting = threading.Thread(target=_take, args=(consumer, got, stop), daemon=True)
    waiting.start()
    sent = broker.enqueue(_message())
    waiting.join(timeout=30)
    stop.set()
    assert [m.message_id for m in got] == [sent.message_id]
    consumer.ack(got[0])
    assert broker.do_qsize("work") == 0


def test_rings_nobody_waits_for_are_bounded_and_cost_only_an_empty_fetch(
    broker: DoorbellRedisBroker,
) -> None:
    for _ in range(DOORBELL_RINGS + 10):
        broker.enqueue(_message())
    bell = broker.doorbell("work")
    assert broker.client.llen(bell) == DOORBELL_RINGS
    assert broker.client.ttl(bell) > 0  # and they expire
    broker.flush("work")
    consumer = broker.consume("work", prefetch=1, timeout=POLL_MS)
    consumer.misses = 30
    assert next(consumer) is None  # a stale ring: one empty fetch, at once
    assert broker.client.llen(bell) == DOORBELL_RINGS - 1
