"""The channels the web tier and the workers share for interactive requests: both backends."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from django.conf import settings

from boardwalk.channels import Channels, MemoryChannels, RedisChannels


def _backends() -> list[str]:
    return ["memory", "redis"] if settings.REDIS_URL else ["memory"]


@pytest.fixture(params=_backends())
def store(request) -> Iterator[Channels]:
    if request.param == "memory":
        yield MemoryChannels()
    else:
        yield RedisChannels(settings.REDIS_URL, f"test-channels-{uuid.uuid4().hex}")


def test_a_short_gauge_report_does_not_cut_the_others_short(store: Channels):
    key = f"gauge-{uuid.uuid4().hex}"
    store.gauge(key, "worker-a", 3, ttl=30)
    store.gauge(key, "worker-b", 5, ttl=0.001)  # worker b zeroes its report as it stops
    time.sleep(1.2)  # past the short report's expiry, rounded up to Redis's second
    assert store.gauge_sum(key) == 3


def test_a_list_pops_in_order_and_a_flag_is_seen(store: Channels):
    key = f"list-{uuid.uuid4().hex}"
    store.push(key, b"one", ttl=30)
    store.push(key, b"two", ttl=30)
    assert store.length(key) == 2
    assert store.pop(key, timeout=1) == b"one"
    assert store.pop(key, timeout=1) == b"two"
    assert store.pop(key, timeout=0.05) is None
    store.flag(f"{key}:flag", ttl=30)
    assert store.flagged([f"{key}:flag", f"{key}:other"]) == {f"{key}:flag"}


def test_a_pop_over_several_lists_takes_the_first_that_has_a_message(store: Channels):
    first, second = f"list-{uuid.uuid4().hex}", f"list-{uuid.uuid4().hex}"
    assert store.pop_any([first, second], timeout=0.05) is None
    store.push(second, b"b1", ttl=30)
    assert store.pop_any([first, second], timeout=1) == (second, b"b1")
    store.push(second, b"b2", ttl=30)
    store.push(first, b"a1", ttl=30)
    assert store.pop_any([first, second], timeout=1) == (first, b"a1")
    assert store.pop_any([first, second], timeout=1) == (second, b"b2")
    assert store.length(first) == store.length(second) == 0


def test_a_blocked_pop_over_several_lists_wakes_for_a_later_push(store: Channels):
    lists = [f"list-{uuid.uuid4().hex}" for _ in range(3)]
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(store.pop_any(lists, timeout=10)))
    waiter.start()
    time.sleep(0.1)
    store.push(lists[2], b"rung", ttl=30)
    waiter.join(timeout=10)
    assert got == [(lists[2], b"rung")]


def test_a_claim_is_taken_once_until_it_lapses(store: Channels):
    key = f"claim-{uuid.uuid4().hex}"
    assert store.claim(key, ttl=0.3) is True
    assert store.claim(key, ttl=0.3) is False  # a replayed message finds it taken
    assert store.flagged([key]) == {key}
    time.sleep(1.2)  # past its time to live, rounded up to Redis's second
    assert store.claim(key, ttl=30) is True


def test_gauge_values_are_each_reporters_live_value(store: Channels):
    key = f"gauge-{uuid.uuid4().hex}"
    store.gauge(key, "rev_a:", 1, ttl=30)
    store.gauge(key, "rev_b:dep", 2, ttl=30)
    store.gauge(key, "rev_c:", 3, ttl=0.001)
    time.sleep(1.2)
    assert store.gauge_values(key) == {"rev_a:": 1, "rev_b:dep": 2}
    assert store.gauge_sum(key) == 3


def test_memory_channels_forget_expired_flags(monkeypatch):
    from boardwalk import channels as module

    monkeypatch.setattr(module, "_PURGE_EVERY", 10)
    store = MemoryChannels()
    for i in range(9):
        store.flag(f"short-{i}", ttl=0.001)
    time.sleep(0.01)
    store.flag("kept", ttl=30)  # the tenth write purges the lapsed ones

    assert set(store._values) == {"kept"}
