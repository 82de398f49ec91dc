"""Short-lived channels between processes: lists, flags, counters and gauges that expire.

Interactive requests travel from the web tier to a worker and their replies back over these
(batches.interactive). Redis in production (REDIS_URL set): lists popped with BLPOP, every key
with a time to live, so nothing a crashed process left behind outlives its TTL. The embedded
default (one process) keeps the same shapes in memory. Messages are bytes; what they mean is
the caller's. Keys are namespaced by BOARDWALK_BROKER_NAMESPACE.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Protocol

import redis
from django.conf import settings

_SOCKET_SLACK_SECONDS = 5.0  # a blocking pop's socket waits this much longer than the pop
_PURGE_EVERY = 4096  # in-memory flag and counter writes between purges of the expired ones


class Channels(Protocol):
    def push(self, key: str, message: bytes, *, ttl: float) -> None:
        """Append to the list `key`, which expires `ttl` seconds after its last push."""

    def pop(self, key: str, *, timeout: float) -> bytes | None:
        """The list's first message, waiting up to `timeout` seconds; None if none came."""

    def pop_any(self, keys: list[str], *, timeout: float) -> tuple[str, bytes] | None:
        """The first message of the first of `keys` that has one, and that key, waiting up to
        `timeout` seconds for one to come; None if none came."""

    def length(self, key: str) -> int: ...

    def delete(self, key: str) -> None: ...

    def flag(self, key: str, *, ttl: float) -> None:
        """Raise a flag that lowers itself after `ttl` seconds."""

    def flagged(self, keys: list[str]) -> set[str]:
        """Which of `keys` are raised flags."""

    def claim(self, key: str, *, ttl: float) -> bool:
        """Raise the flag `key` unless it is raised already: whether this call raised it."""

    def add(self, key: str, delta: int, *, ttl: float) -> int:
        """Add to the counter `key` (created at 0, expiring `ttl` after this add): its value."""

    def gauge(self, key: str, field: str, value: int, *, ttl: float) -> None:
        """Set one reporter's value of a gauge; it counts for `ttl` seconds."""

    def gauge_sum(self, key: str) -> int:
        """The sum of the gauge's values that have not expired."""

    def gauge_values(self, key: str) -> dict[str, int]:
        """Each reporter's value of the gauge that has not expired."""


class MemoryChannels:
    """The embedded default's channels: one process, so plain locked dictionaries."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._lists: dict[str, tuple[deque[bytes], float]] = {}
        self._values: dict[str, tuple[int, float]] = {}
        self._gauges: dict[str, dict[str, tuple[int, float]]] = {}
        self._writes = 0  # flags and counters set since the last purge of expired ones

    def _set_value(self, key: str, value: int, expires: float) -> None:
        """Caller holds the condition. Every `_PURGE_EVERY` writes, expired flags and counters
        go (a long-running process raises flags for every interactive request it serves)."""
        self._values[key] = (value, expires)
        self._writes += 1
        if self._writes >= _PURGE_EVERY:
            self._writes = 0
            now = time.monotonic()
            for stale in [k for k, (_, until) in self._values.items() if until <= now]:
                del self._values[stale]

    def _live_list(self, key: str) -> deque[bytes] | None:
        entry = self._lists.get(key)
        if entry is None:
            return None
        if entry[1] <= time.monotonic():
            del self._lists[key]
            return None
        return entry[0]

    def push(self, key: str, message: bytes, *, ttl: float) -> None:
        with self._cond:
            items = self._live_list(key) or deque()
            items.append(message)
            self._lists[key] = (items, time.monotonic() + ttl)
            self._cond.notify_all()

    def pop(self, key: str, *, timeout: float) -> bytes | None:
        found = self.pop_any([key], timeout=timeout)
        return None if found is None else found[1]

    def pop_any(self, keys: list[str], *, timeout: float) -> tuple[str, bytes] | None:
        until = time.monotonic() + timeout
        with self._cond:
            while True:
                for key in keys:
                    items = self._live_list(key)
                    if items:
                        message = items.popleft()
                        if not items:
                            del self._lists[key]
                        return key, message
                left = until - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def length(self, key: str) -> int:
        with self._cond:
            return len(self._live_list(key) or ())

    def delete(self, key: str) -> None:
        with self._cond:
            self._lists.pop(key, None)
            self._values.pop(key, None)
            self._gauges.pop(key, None)

    def flag(self, key: str, *, ttl: float) -> None:
        with self._cond:
            self._set_value(key, 1, time.monotonic() + ttl)

    def flagged(self, keys: list[str]) -> set[str]:
        now = time.monotonic()
        with self._cond:
            return {k for k in keys if (v := self._values.get(k)) is not None and v[1] > now}

    def claim(self, key: str, *, ttl: float) -> bool:
        now = time.monotonic()
        with self._cond:
            entry = self._values.get(key)
            if entry is not None and entry[1] > now:
                return False
            self._set_value(key, 1, now + ttl)
            return True

    def add(self, key: str, delta: int, *, ttl: float) -> int:
        now = time.monotonic()
        with self._cond:
            value, expires = self._values.get(key, (0, now))
            value = (value if expires > now else 0) + delta
            self._set_value(key, value, now + ttl)
            return value

    def gauge(self, key: str, field: str, value: int, *, ttl: float) -> None:
        with self._cond:
            self._gauges.setdefault(key, {})[field] = (value, time.monotonic() + ttl)

    def gauge_sum(self, key: str) -> int:
        return sum(self.gauge_values(key).values())

    def gauge_values(self, key: str) -> dict[str, int]:
        now = time.monotonic()
        with self._cond:
            return {f: v for f, (v, expires) in self._gauges.get(key, {}).items() if expires > now}


# HSET the field, then extend the hash's expiry, never shorten it (PTTL is -1 for a hash
# that has none yet).
_GAUGE_SET = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
"""


class RedisChannels:
    """Production channels: one Redis, shared by the web tier and every worker."""

    def __init__(self, url: str, namespace: str) -> None:
        self._client = redis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=5.0)
        self._url = url
        self._prefix = f"{namespace}:ch:"
        self._blocking = threading.local()
        self._gauge_set = self._client.register_script(_GAUGE_SET)

    def _k(self, key: str) -> str:
        return self._prefix + key

    def push(self, key: str, message: bytes, *, ttl: float) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.rpush(self._k(key), message)
        pipe.expire(self._k(key), max(1, int(ttl + 0.999)))
        pipe.execute()

    def pop(self, key: str, *, timeout: float) -> bytes | None:
        found = self.pop_any([key], timeout=timeout)
        return None if found is None else found[1]

    def pop_any(self, keys: list[str], *, timeout: float) -> tuple[str, bytes] | None:
        # A blocking pop holds its connection; each thread keeps its own with a socket that
        # waits longer than the pop.
        client = getattr(self._blocking, "client", None)
        if client is None:
            client = self._blocking.client = redis.Redis.from_url(
                self._url, socket_connect_timeout=2.0, socket_timeout=60 + _SOCKET_SLACK_SECONDS
            )
        found = client.blpop([self._k(k) for k in keys], timeout=max(0.01, min(timeout, 60.0)))
        if found is None:
            return None
        name, message = found  # type: ignore[misc]
        name = name.decode() if isinstance(name, bytes) else str(name)
        return name.removeprefix(self._prefix), bytes(message)  # type: ignore[arg-type]

    def length(self, key: str) -> int:
        return int(self._client.llen(self._k(key)))

    def delete(self, key: str) -> None:
        self._client.delete(self._k(key))

    def flag(self, key: str, *, ttl: float) -> None:
        self._client.set(self._k(key), 1, px=max(1, int(ttl * 1000)))

    def flagged(self, keys: list[str]) -> set[str]:
        if not keys:
            return set()
        values = self._client.mget([self._k(k) for k in keys])
        return {k for k, v in zip(keys, values, strict=True) if v is not None}

    def claim(self, key: str, *, ttl: float) -> bool:
        return bool(self._client.set(self._k(key), 1, px=max(1, int(ttl * 1000)), nx=True))

    def add(self, key: str, delta: int, *, ttl: float) -> int:
        pipe = self._client.pipeline(transaction=True)
        pipe.incrby(self._k(key), delta)
        pipe.pexpire(self._k(key), max(1, int(ttl * 1000)))
        value, _ = pipe.execute()
        return int(value)

    def gauge(self, key: str, field: str, value: int, *, ttl: float) -> None:
        # The hash lives as long as its longest-lived field: a short report (a worker
        # zeroing its own field as it stops) must not cut the others' expiry short.
        expires = time.time() + ttl
        self._gauge_set(
            keys=[self._k(key)], args=[field, f"{value}:{expires:.3f}", max(1, int(ttl * 1000))]
        )

    def gauge_sum(self, key: str) -> int:
        return sum(self.gauge_values(key).values())

    def gauge_values(self, key: str) -> dict[str, int]:
        now = time.time()
        values = {}
        for field, raw in self._client.hgetall(self._k(key)).items():
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            value, _, expires = text.partition(":")
            if float(expires) > now:
                name = field.decode() if isinstance(field, bytes) else str(field)
                values[name] = int(value)
        return values


_channels: Channels | None = None
_lock = threading.Lock()


def channels() -> Channels:
    """This process's channels (Redis when REDIS_URL is set, else in memory)."""
    global _channels
    with _lock:
        if _channels is None:
            _channels = (
                RedisChannels(settings.REDIS_URL, settings.BROKER_NAMESPACE)
                if settings.REDIS_URL
                else MemoryChannels()
            )
        return _channels
