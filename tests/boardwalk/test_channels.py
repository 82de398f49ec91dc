"""The channels the web tier and the workers share for interactive requests: both backends."""

from __future__ import annotations

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
