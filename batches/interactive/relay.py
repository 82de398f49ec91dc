"""The web tier's side: hand an accepted request to the workers and read its replies.

While a request is answered, the web process keeps its listener flag raised: one thread per
process refreshes the flags of every request it answers each `REFRESH_SECONDS` (so a client
that reads slowly, blocking its request's thread on a full socket, keeps its flag), and a flag
lowers itself `LISTEN_TTL_SECONDS` after its last refresh. A worker whose request lost its
listener (the web process died, or the broker lost its keys) stops it as it stops one whose
client closed the stream. And it watches the worker that took the request: a
feed whose liveness flag lapsed is gone, and the request ends as `worker_lost` instead of
waiting out its timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from batches.interactive.config import setting
from batches.interactive.messages import (
    WANTED_GAUGE,
    abort_flag,
    bell_channel,
    decode_reply,
    feed_alive_flag,
    listener_flag,
    reply_channel,
    request_channel,
    wanted_field,
)
from batches.interactive.service import Accepted
from batches.interactive.tasks import interactive_wake
from boardwalk.broker import BROKER_UNREACHABLE
from boardwalk.channels import channels
from boardwalk.logs import exception_trace

logger = logging.getLogger(__name__)

ABORT_TTL_SECONDS = 120.0
SLICE_SECONDS = 1.0  # the longest single wait on the reply channel (then a worker check)
LISTEN_TTL_SECONDS = 2.0  # a listener flag not refreshed for this long: nobody reads
REFRESH_SECONDS = 0.4
WORKER_CHECK_SECONDS = 2.0  # how often a silent wait asks whether its worker still lives
WORKER_LOST = "worker_lost"  # the reply code of a request whose worker went away


class NotTaken(Exception):
    """No worker took the request in time."""


def dispatch(accepted: Accepted) -> None:
    key = accepted.key
    queue_seconds = setting("INTERACTIVE_QUEUE_SECONDS")
    ch = channels()
    _listeners.add(accepted.submitted.id)
    ch.gauge(WANTED_GAUGE, wanted_field(key), 1, ttl=queue_seconds + 5)
    ch.push(request_channel(key), accepted.submitted.encode(), ttl=queue_seconds + 5)
    ch.push(bell_channel(key.revision_id), wanted_field(key).encode(), ttl=queue_seconds + 5)
    try:
        interactive_wake.send(key.revision_id, key.deployment_id)
    except BROKER_UNREACHABLE as exc:
        # A worker already serving the key still takes it; else it times out as not taken.
        logger.error("broker unreachable; interactive wake-up not sent: %s", exception_trace(exc))


def wait_taken(accepted: Accepted) -> dict[str, Any] | None:
    """Return once a worker has the request: None, or the error it was refused with before
    it ran. NotTaken (and the request withdrawn) if no worker took it within
    BOARDWALK_INTERACTIVE_QUEUE_SECONDS."""
    message = _pop(accepted, time.monotonic() + setting("INTERACTIVE_QUEUE_SECONDS"))
    if message is None:
        abort(accepted)
        raise NotTaken
    if message["kind"] == "taken":
        accepted.worker = message.get("worker", "")
        return None
    return message


def replies(accepted: Accepted) -> Iterator[dict[str, Any]]:
    """The request's replies after "taken", up to its "result" or "error"; an "error" with
    code "timeout" when the run takes longer than BOARDWALK_INTERACTIVE_TIMEOUT_SECONDS, and
    one with code `WORKER_LOST` when the worker that took it stopped reporting."""
    until = time.monotonic() + setting("INTERACTIVE_TIMEOUT_SECONDS")
    while True:
        message = _pop(accepted, until, watch_worker=True)
        if message is None:
            abort(accepted)
            yield {"kind": "error", "code": "timeout"}
            return
        if message["kind"] == "aborted":
            message = {"kind": "error", "code": "aborted"}
        yield message
        if message["kind"] in ("result", "error"):
            channels().delete(reply_channel(accepted.submitted.id))
            return


def abort(accepted: Accepted) -> None:
    """Tell the worker to stop the request (the client went away, or gave up). Best effort:
    with the broker down the flag cannot be raised, and the worker stops the request when
    its listener flag lapses or its replies cannot be delivered."""
    try:
        channels().flag(abort_flag(accepted.submitted.id), ttl=ABORT_TTL_SECONDS)
    except Exception as exc:
        logger.warning("abort of %s not sent: %s", accepted.submitted.id, exception_trace(exc))


def done(accepted: Accepted) -> None:
    """The web process answered the request (or gave up on it): its listener flag lapses."""
    _listeners.discard(accepted.submitted.id)


class _Listeners:
    """The requests this process answers, their listener flags refreshed by one thread that
    runs while there are any."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._lock = threading.Lock()
        self._running = False
        self._tick = threading.Event()  # never set: its wait is the pause between refreshes

    def add(self, request_id: str) -> None:
        channels().flag(listener_flag(request_id), ttl=LISTEN_TTL_SECONDS)  # before the push
        with self._lock:
            self._ids.add(request_id)
            if not self._running:
                self._running = True
                threading.Thread(
                    target=self._refresh, name="interactive-listeners", daemon=True
                ).start()

    def discard(self, request_id: str) -> None:
        with self._lock:
            self._ids.discard(request_id)

    def _refresh(self) -> None:
        while True:
            self._tick.wait(REFRESH_SECONDS)
            with self._lock:
                ids = list(self._ids)
                if not ids:  # nothing to answer: the next request starts a new thread
                    self._running = False
                    return
            for request_id in ids:
                try:
                    channels().flag(listener_flag(request_id), ttl=LISTEN_TTL_SECONDS)
                except Exception as exc:  # the broker is down: its flags are gone anyway
                    logger.warning("listener flags not refreshed: %s", exception_trace(exc))
                    break


_listeners = _Listeners()


def _pop(accepted: Accepted, until: float, *, watch_worker: bool = False) -> dict[str, Any] | None:
    """The next reply before `until` (monotonic), in waits of at most SLICE_SECONDS (a
    broker's blocking pop may be capped shorter than the wait); a lost worker's reply when
    `watch_worker` finds it gone. None when the time is up."""
    ch = channels()
    last_check = time.monotonic()
    while True:
        left = until - time.monotonic()
        if left <= 0:
            return None
        raw = ch.pop(reply_channel(accepted.submitted.id), timeout=min(left, SLICE_SECONDS))
        if raw is not None:
            return decode_reply(accepted.submitted, raw)
        now = time.monotonic()
        if watch_worker and accepted.worker and now - last_check >= WORKER_CHECK_SECONDS:
            last_check = now
            if not ch.flagged([feed_alive_flag(accepted.worker)]):
                logger.warning(
                    "interactive %s: worker %s stopped reporting",
                    accepted.submitted.id,
                    accepted.worker,
                )
                return {"kind": "error", "code": WORKER_LOST}
