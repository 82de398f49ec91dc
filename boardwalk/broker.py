"""The Dramatiq broker, configured explicitly (never django-dramatiq's defaults).

The broker only wakes workers (docs/ARCHITECTURE.md decision 1); the database holds every item's
state and lease, and a periodic sweep re-wakes work whose message was lost. So losing or duplicating
a message costs latency, never work.

- REDIS_URL set: a RedisBroker with a short heartbeat and frequent maintenance, so a killed
  worker's unacked message is re-delivered within seconds (the defaults took > 15 minutes),
  and a doorbell that wakes an idle consumer as soon as a message is sent
  (`DoorbellRedisBroker`).
- REDIS_URL unset (embedded default): a StubBroker consumed by an in-process worker thread.

Requests enqueue through `send_after_commit`, never `actor.send` directly: the message goes
out only once the rows it names are committed, and a broker that is down costs a log line
(the sweeper re-wakes the work), never the answer to a request whose work was committed.
"""

from __future__ import annotations

import logging
from typing import Any

import dramatiq
import redis
from django.conf import settings
from django.db import close_old_connections, connections, transaction
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import compute_backoff
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import (
    AgeLimit,
    Callbacks,
    Pipelines,
    Retries,
    ShutdownNotifications,
    TimeLimit,
)

from boardwalk.logs import exception_trace

logger = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT_MS = 5_000
MAINTENANCE_CHANCE = 100_000  # out of 1,000,000 broker commands: about every tenth
# Actors bound their own work (see inference.tasks); this is the backstop. Dramatiq's
# TimeLimitExceeded is a BaseException, so no `except Exception` swallows it.
DEFAULT_TIME_LIMIT_MS = 30 * 60 * 1000
# A Redis that hangs (paused, partitioned) must not hang a request that enqueues: give up
# after this and let the sweeper re-wake the work. Consumers poll without blocking commands,
# so no legitimate call takes this long.
REDIS_SOCKET_TIMEOUT_SECONDS = 5.0
REDIS_CONNECT_TIMEOUT_SECONDS = 2.0

# Rings kept per queue for consumers that are not waiting yet, and for how long: a ring
# nobody took in time only costs a waiting consumer one early, empty fetch.
DOORBELL_RINGS = 16
DOORBELL_TTL_SECONDS = 5
_DOORBELL_LONGEST_WAIT_SECONDS = REDIS_SOCKET_TIMEOUT_SECONDS / 2

_broker: dramatiq.Broker | None = None


class DoorbellRedisBroker(RedisBroker):
    """A RedisBroker whose idle consumers wake as soon as a message is enqueued.

    Dramatiq's Redis consumers poll: an idle one sleeps up to its timeout
    (BOARDWALK_WORKER_POLL_MS) between fetches, so every hop through the broker (a batch's
    first wake-up) waited half a poll on average, more under load. Here every enqueue also
    pushes a ring onto the queue's doorbell list, and an idle consumer that could take a
    message waits on that list (BLPOP, with the same timeout) instead of sleeping: Redis hands
    each ring to one waiting consumer, which fetches at once. The poll stays as the fallback
    for messages that arrive without a ring (re-delivered from a dead worker by maintenance).
    """

    @property
    def consumer_class(self) -> type[_RedisConsumer]:
        return _DoorbellConsumer

    def doorbell(self, queue_name: str) -> str:
        return f"{self.namespace}:doorbell:{queue_name}"

    def do_enqueue(self, queue_name: str, *args: Any) -> Any:
        enqueued = self._dispatch("enqueue")(queue_name, *args)
        bell = self.doorbell(queue_name)
        ring = self.client.pipeline(transaction=False)
        ring.rpush(bell, 1).ltrim(bell, -DOORBELL_RINGS, -1).expire(bell, DOORBELL_TTL_SECONDS)
        ring.execute()
        return enqueued


# Extends Dramatiq's private Redis consumer (pyproject pins dramatiq 2.2.1; recheck its
# `__next__` when upgrading): only the idle wait differs, fetching and acking are its own.
class _DoorbellConsumer(_RedisConsumer):
    def __next__(self) -> Any:
        if not self.message_cache and self.outstanding_message_count < self.prefetch:
            try:
                self.message_cache = self.broker.do_fetch(
                    self.queue_name, self.prefetch - self.outstanding_message_count
                )
                if not self.message_cache:
                    self.misses, backoff_ms = compute_backoff(self.misses, max_backoff=self.timeout)
                    # Never 0 (BLPOP's 0 waits forever), and inside the socket's timeout.
                    wait = min(max(backoff_ms, 1) / 1000, _DOORBELL_LONGEST_WAIT_SECONDS)
                    self.broker.client.blpop([self.broker.doorbell(self.queue_name)], wait)
                    return None  # called again at once: the fetch then finds what rang
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise ConnectionClosed(exc) from None
        return super().__next__()


class DjangoConnections(dramatiq.Middleware):
    """Give each message a healthy database connection, and close it when a thread ends.

    Worker threads are not request threads, so Django's request signals never recycle
    their connections; without this a dead connection would poison every later message.
    """

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        close_old_connections()

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: Any,
        *,
        result: object = None,
        exception: BaseException | None = None,
    ) -> None:
        close_old_connections()

    def before_worker_thread_shutdown(self, broker: dramatiq.Broker, thread: object) -> None:
        connections.close_all()


def _middleware() -> list[dramatiq.Middleware]:
    return [
        AgeLimit(),
        TimeLimit(time_limit=DEFAULT_TIME_LIMIT_MS, interval=1000),
        ShutdownNotifications(),
        Callbacks(),
        Pipelines(),
        Retries(max_retries=5, min_backoff=1_000, max_backoff=60_000),
        DjangoConnections(),
    ]


def setup_broker() -> dramatiq.Broker:
    """Create and install the global broker once per process (before actors are declared)."""
    global _broker
    if _broker is not None:
        return _broker
    if settings.REDIS_URL:
        pool = redis.ConnectionPool.from_url(
            settings.REDIS_URL,
            socket_timeout=REDIS_SOCKET_TIMEOUT_SECONDS,
            socket_connect_timeout=REDIS_CONNECT_TIMEOUT_SECONDS,
        )
        broker: dramatiq.Broker = DoorbellRedisBroker(
            connection_pool=pool,
            namespace=settings.BROKER_NAMESPACE,
            middleware=_middleware(),
            heartbeat_timeout=HEARTBEAT_TIMEOUT_MS,
            maintenance_chance=MAINTENANCE_CHANCE,
        )
    else:
        broker = StubBroker(middleware=_middleware())
        broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    _broker = broker
    return broker


def is_embedded() -> bool:
    return not settings.REDIS_URL


# What a send raises when the broker cannot be reached (Redis down, refusing, timing out).
BROKER_UNREACHABLE: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    dramatiq.errors.BrokerConnectionError,
    OSError,
)


def send_after_commit(actor: dramatiq.Actor, *args: Any) -> None:
    """Enqueue `actor(*args)` once the current transaction commits (at once outside one).

    The message only wakes a worker (the database holds the work), so a broker that cannot
    be reached is logged, by error type and frames only, and left to the sweeper, which re-wakes
    claimable items and re-drives finalization every sweep interval.
    """

    def send() -> None:
        try:
            actor.send(*args)
        except BROKER_UNREACHABLE as exc:
            logger.error(
                "broker unreachable; %s not enqueued, the sweeper will re-wake it: %s",
                actor.actor_name,
                exception_trace(exc),
            )

    transaction.on_commit(send)
