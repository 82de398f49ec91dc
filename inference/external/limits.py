"""How many rows of one external revision may be in flight at once, across every worker.

The limit adapts as TCP's window does (AIMD): it starts at the revision's `max_in_flight`
(its cap), grows by one on each success, and halves on congestion (429, 503, timeouts,
connection errors: `Retryable.congestion`), never below `floor`. Several rows failing in the
same storm halve it once: a slot remembers the limit's epoch when it was taken, and only a
congestion signal from a slot of the current epoch halves it (and starts a new epoch), as TCP
halves once per window of losses.

Two stores, one behaviour:

- `RedisInFlightLimit`, for production (several worker processes, each driving many
  requests): one sorted set of slot leases per revision, scored by their expiry on the Redis
  server's clock, and one hash with the limit and its epoch. Taking and returning a slot is one
  Lua script each, so the count is exact across processes. A slot held by a worker that was
  killed with kill -9 lapses `ttl_seconds` after its last renewal (`held` renews it while the
  request runs), and every take first sweeps lapsed slots out.
- `LocalInFlightLimit`, for the embedded default (one process, no Redis).

`held()` is the one way a caller uses either: it waits for a slot (until a deadline), keeps it
renewed, and gives it back with the outcome the caller reported.

Both also keep the revision's busy clock, which meters a private deployment's GPU time: the
server is busy while at least one slot is held, by any process, and each slot's share of that
time is the time it was held divided by the slots held with it (so overlap is charged once,
and the shares of all slots add up to the busy time). The clock is one number, the busy time
per slot since the clock began (`busy`: it advances by the time since its last change divided
by the slots held during it, at every take and give-back); a slot's share is the difference
between its value when the slot was given back and when it was taken (`Held.busy_seconds`).
A lapsed slot (its worker killed) counts as held until it lapses: the other slots' shares are
that much smaller, never larger.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from inference.external.client import Outcome, Retryable, Success

__all__ = [
    "Held",
    "InFlightLimit",
    "LocalInFlightLimit",
    "RedisInFlightLimit",
    "Signal",
    "Slot",
    "signal_of",
]


class Signal(StrEnum):
    SUCCESS = "success"  # +1, up to the cap
    CONGESTION = "congestion"  # halved, once per epoch, down to the floor
    NEUTRAL = "neutral"  # no change: a final error, a row not sent, a cancelled request


def signal_of(outcome: Outcome) -> Signal:
    """What a row's outcome says about the upstream's load."""
    if isinstance(outcome, Success):
        return Signal.SUCCESS
    if isinstance(outcome, Retryable) and outcome.congestion:
        return Signal.CONGESTION
    return Signal.NEUTRAL


@dataclass(frozen=True)
class Slot:
    id: str
    epoch: int
    busy_mark: float = 0.0  # the busy clock when it was taken (seconds per slot)


def _grown(limit: int, cap: int) -> int:
    return min(cap, limit + 1)


def _halved(limit: int, floor: int) -> int:
    return max(floor, limit // 2)


class InFlightLimit:
    """The waiting, renewing and reporting both stores share; subclasses keep the count."""

    def __init__(
        self, *, cap: int, floor: int = 1, ttl_seconds: float = 10.0, poll_seconds: float = 0.05
    ) -> None:
        if not 1 <= floor <= cap:
            raise ValueError(f"an in-flight limit needs 1 <= floor <= cap (got {floor}, {cap})")
        self.cap = cap
        self.floor = floor
        self.ttl_seconds = ttl_seconds
        self.poll_seconds = poll_seconds
        self._freed: asyncio.Event | None = None
        self._try: asyncio.Lock | None = None

    # -- the store ------------------------------------------------------------------------

    async def try_acquire(self) -> Slot | None:
        """A slot if fewer than the limit are in flight, else None."""
        raise NotImplementedError

    async def release(self, slot: Slot, signal: Signal) -> float:
        """Give the slot back; returns the busy clock then."""
        raise NotImplementedError

    async def renew(self, slot: Slot) -> bool:
        """Push the slot's lapse `ttl_seconds` on; False when it had lapsed already."""
        raise NotImplementedError

    async def state(self) -> tuple[int, int]:
        """(limit, slots in flight) now."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------

    def _event(self) -> asyncio.Event:
        if self._freed is None:
            self._freed = asyncio.Event()
        return self._freed

    def _trying(self) -> asyncio.Lock:
        """Held around each try of a waiter: the rows of a process waiting for a slot ask the
        store one after another, not all at once (each a Redis round trip and connection)."""
        if self._try is None:
            self._try = asyncio.Lock()
        return self._try

    def _notify(self) -> None:
        event = self._event()
        event.set()
        event.clear()

    async def acquire(self, *, deadline: float | None = None) -> Slot | None:
        """A slot, waiting for one; None when `deadline` (epoch seconds) comes first.
        Waiters wake when this process gives a slot back, and poll for slots other
        processes give back, one try at a time."""
        while True:
            async with self._trying():  # one try at a time in this process
                slot = await self.try_acquire()
            if slot is not None:
                return slot
            wait = self.poll_seconds
            if deadline is not None:
                left = deadline - time.time()
                if left <= 0:
                    return None
                wait = min(wait, left)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event().wait(), wait)

    @contextlib.asynccontextmanager
    async def held(self, *, deadline: float | None = None) -> AsyncIterator[Held | None]:
        """`async with limit.held(deadline=d) as held:` a slot kept renewed while the block
        runs (None when the deadline came first), given back at its end with `held.signal`
        (NEUTRAL unless the block reported another, as when it is cancelled)."""
        slot = await self.acquire(deadline=deadline)
        if slot is None:
            yield None
            return
        held = Held(slot)
        done = asyncio.Event()
        renewing = asyncio.create_task(self._keep(slot, done))
        try:
            yield held
        finally:
            # Stopped between renewals, never cancelled inside one: a Redis command cut
            # short can leave its connection waiting for a reply it already skipped.
            done.set()
            with contextlib.suppress(Exception):
                await asyncio.shield(renewing)
            busy = await asyncio.shield(self.release(slot, held.signal))
            held.busy_seconds = max(0.0, busy - slot.busy_mark)
            self._notify()

    async def _keep(self, slot: Slot, done: asyncio.Event) -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), self.ttl_seconds / 3)
            if not done.is_set():
                await self.renew(slot)


@dataclass
class Held:
    slot: Slot
    signal: Signal = Signal.NEUTRAL
    # Once given back: the slot's share of the time the server was busy (module doc).
    busy_seconds: float = 0.0

    def report(self, signal: Signal) -> None:
        self.signal = signal


class LocalInFlightLimit(InFlightLimit):
    """The count in this process (the embedded default: one worker process, no Redis)."""

    def __init__(
        self,
        *,
        cap: int,
        floor: int = 1,
        clock: Callable[[], float] = time.monotonic,
        **options: Any,
    ) -> None:
        super().__init__(cap=cap, floor=floor, **options)
        self._limit = cap
        self._epoch = 0
        self._slots: dict[str, float] = {}
        self._clock = clock
        self._busy = 0.0
        self._mark = clock()

    def _sweep(self) -> float:
        """Advance the busy clock over the slots held since its last change, then let the
        lapsed ones go; returns the clock."""
        now = self._clock()
        if self._slots:
            self._busy += (now - self._mark) / len(self._slots)
        self._mark = now
        for slot_id in [s for s, expiry in self._slots.items() if expiry <= now]:
            del self._slots[slot_id]
        return self._busy

    async def try_acquire(self) -> Slot | None:
        busy = self._sweep()
        if len(self._slots) >= self._limit:
            return None
        slot = Slot(uuid.uuid4().hex, self._epoch, busy)
        self._slots[slot.id] = self._clock() + self.ttl_seconds
        return slot

    async def release(self, slot: Slot, signal: Signal) -> float:
        busy = self._sweep()
        self._slots.pop(slot.id, None)
        if signal is Signal.SUCCESS:
            self._limit = _grown(self._limit, self.cap)
        elif signal is Signal.CONGESTION and slot.epoch == self._epoch:
            self._limit = _halved(self._limit, self.floor)
            self._epoch += 1
        return busy

    async def renew(self, slot: Slot) -> bool:
        if slot.id not in self._slots:
            return False
        self._slots[slot.id] = self._clock() + self.ttl_seconds
        return True

    async def state(self) -> tuple[int, int]:
        self._sweep()
        return self._limit, len(self._slots)


# KEYS[1] the slots (member: slot id, score: lapse in ms on the server's clock), KEYS[2] the
# state hash (limit, epoch, and the busy clock: busy, in ms per slot, and mark, when it last
# changed). Each script reads the server's TIME, so workers' clocks never disagree about a
# lapse or a share.
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
_STATE = """
local cap = tonumber(ARGV[2])
local floor = tonumber(ARGV[3])
local limit = tonumber(redis.call('HGET', KEYS[2], 'limit') or cap)
if limit > cap then limit = cap end
if limit < floor then limit = floor end
local epoch = tonumber(redis.call('HGET', KEYS[2], 'epoch') or '0')
"""
# The busy clock advanced over the slots held since its last change (lapsed ones included, as
# the local store counts them), then the lapsed slots let go. Returned as a string: Redis
# truncates a Lua number in a reply to an integer.
_BUSY = """
local held = redis.call('ZCARD', KEYS[1])
local mark = tonumber(redis.call('HGET', KEYS[2], 'mark') or now)
local busy = tonumber(redis.call('HGET', KEYS[2], 'busy') or '0')
if held > 0 and now > mark then busy = busy + (now - mark) / held end
local busy_text = string.format('%.17g', busy)
redis.call('HSET', KEYS[2], 'mark', now, 'busy', busy_text)
redis.call('EXPIRE', KEYS[2], 86400)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
"""
_ACQUIRE = (
    _NOW
    + _STATE
    + _BUSY
    + """
local ttl = tonumber(ARGV[4])
if redis.call('ZCARD', KEYS[1]) >= limit then
  return {0, epoch, busy_text}
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return {1, epoch, busy_text}
"""
)
_RELEASE = (
    _NOW
    + _STATE
    + _BUSY
    + """
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[4] == 'success' then
  limit = math.min(cap, limit + 1)
elseif ARGV[4] == 'congestion' and tonumber(ARGV[5]) == epoch then
  limit = math.max(floor, math.floor(limit / 2))
  epoch = epoch + 1
end
redis.call('HSET', KEYS[2], 'limit', limit, 'epoch', epoch)
return {limit, epoch, busy_text}
"""
)
_RENEW = (
    _NOW
    + """
local ttl = tonumber(ARGV[2])
local renewed = redis.call('ZADD', KEYS[1], 'XX', 'CH', now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return renewed
"""
)
_STATE_NOW = (
    _NOW
    + _STATE
    + _BUSY
    + """
return {limit, redis.call('ZCARD', KEYS[1])}
"""
)


class RedisInFlightLimit(InFlightLimit):
    """The count in Redis, shared by every worker process serving the revision."""

    def __init__(
        self,
        redis: Any,
        revision_id: str,
        *,
        cap: int,
        floor: int = 1,
        prefix: str = "boardwalk:external",
        **options: Any,
    ) -> None:
        """`redis`: a `redis.asyncio.Redis` client."""
        super().__init__(cap=cap, floor=floor, **options)
        self._redis = redis
        self._keys = [f"{prefix}:{revision_id}:slots", f"{prefix}:{revision_id}:state"]
        self._acquire = redis.register_script(_ACQUIRE)
        self._release = redis.register_script(_RELEASE)
        self._renew = redis.register_script(_RENEW)
        self._state = redis.register_script(_STATE_NOW)

    def _ttl_ms(self) -> int:
        return max(1, math.ceil(self.ttl_seconds * 1000))

    async def try_acquire(self) -> Slot | None:
        slot_id = uuid.uuid4().hex
        taken, epoch, busy = await self._acquire(
            keys=self._keys, args=[slot_id, self.cap, self.floor, self._ttl_ms()]
        )
        return Slot(slot_id, int(epoch), _seconds(busy)) if int(taken) else None

    async def release(self, slot: Slot, signal: Signal) -> float:
        _, _, busy = await self._release(
            keys=self._keys,
            args=[slot.id, self.cap, self.floor, str(signal), slot.epoch],
        )
        return _seconds(busy)

    async def renew(self, slot: Slot) -> bool:
        return bool(await self._renew(keys=self._keys, args=[slot.id, self._ttl_ms()]))

    async def state(self) -> tuple[int, int]:
        limit, in_flight = await self._state(keys=self._keys, args=["", self.cap, self.floor])
        return int(limit), int(in_flight)


def _seconds(busy_ms: Any) -> float:
    """The busy clock as a script returns it (milliseconds per slot, as text), in seconds."""
    text = busy_ms.decode() if isinstance(busy_ms, bytes) else str(busy_ms)
    return float(text) / 1000
