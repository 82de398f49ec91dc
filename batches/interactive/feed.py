"""The worker's side: interactive requests of one engine key, added to the run's engine.

A run of the execution pipeline (batches.execution.pipeline) starts one feed for its key. Its
thread pops the key's request channel, takes each request's prompt ids as the web process
counted them (tokenized once; a message without them is rendered and tokenized here with the
engine's tokenizer), and adds it to the run's engine at once, from its own thread (the engine's
scheduler admits it before any batch request, parking batch rows when none is free); results (and
partial text) go back on the request's reply channel, and are metered and settled here
(batches.interactive.settle), so a web process that went away costs no money.

A request is stopped (and pays what it generated) as soon as nobody reads it: its abort flag
is raised (the client closed the stream), its listener flag lapsed (the web process died, or
the broker lost its keys), or a reply to it could not be delivered (the broker is down). The
feed's thread outlives broker errors (it waits and tries again), and a request runs once
however often its message is pushed (its "taken" flag).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from cryptography.exceptions import InvalidTag
from django.db import connection

from batches.interactive.config import setting
from batches.interactive.messages import (
    Submitted,
    abort_flag,
    encode_reply,
    feed_alive_flag,
    headroom_gauge,
    in_flight_gauge,
    listener_flag,
    others_waiting,
    reply_channel,
    request_channel,
    requests_waiting,
    taken_flag,
)
from batches.interactive.settle import interactive_settle
from batches.liveness import worker_id
from batches.queue import EngineKey
from boardwalk.channels import channels
from boardwalk.codes import ItemCode
from boardwalk.logs import exception_trace
from files.crypto import CryptoError
from inference.chat_completions import dialect_of, result_body, sampling_params
from inference.dialects.streams import ReplyStream
from inference.engine.types import GenerationRequest, GenerationResult, PartialResult
from inference.external.streaming import RelayedPartial
from inference.prompt_bounds import bounded_prompt_ids

logger = logging.getLogger(__name__)

POP_SECONDS = 0.25  # the feed thread's longest wait on the channel (then headroom, aborts)
# While requests are in flight it waits at most this long, and reads their flags each time:
# a client that went away is seen within about a tenth of a second (one MGET).
IN_FLIGHT_POP_SECONDS = 0.1
HEADROOM_TTL_SECONDS = 2.0
REPLY_TTL_SECONDS = 120.0
INTERACTIVE_PRIORITY = 1
# The feed's liveness flag lowers itself this long after its last report (every half second):
# a web process that finds it down answers the request `worker_lost` (relay).
FEED_ALIVE_TTL_SECONDS = 10.0
# After a broker error, the feed's thread waits this long (doubling up to the most) and tries
# again: it never stops while its run lasts.
RETRY_FIRST_SECONDS = 0.25
RETRY_MOST_SECONDS = 2.0


def completion_id(request_id: str) -> str:
    return "chatcmpl-" + request_id.removeprefix("req_")


class InteractiveFeed:
    """Interactive requests of `key` for one run; `submit` adds one to the run's engine (whose
    scheduler puts it ahead of batch). `engine_rows()`: the batch rows the engine holds."""

    def __init__(
        self,
        key: EngineKey,
        *,
        tokenizer: Any,
        context_length: int,
        max_rows: int,
        engine_rows: Callable[[], int],
        submit: Callable[[GenerationRequest], None],
    ) -> None:
        self.key = key
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.max_rows = max_rows
        self.engine_rows = engine_rows
        self.submit = submit
        self.channels = channels()
        self.reporter = worker_id()
        self._lock = threading.Lock()
        # Held by the feed's thread from each pop of the channel until what it popped is in
        # flight (or refused), so a run deciding to end never misses a request in between.
        self._intake = threading.Lock()
        self._closed = False  # the run is ending: requests stay in the channel for the next
        self._inflight: dict[str, Submitted] = {}  # generation id → request
        self._streams: dict[tuple[str, int], ReplyStream] = {}  # (generation id, choice)
        self._rows = 0  # rows (n per request) of the requests in flight
        self._aborted: frozenset[str] = frozenset()
        self._undeliverable: set[str] = set()  # generation ids a reply could not reach
        self._last: float | None = None  # when this run last took an interactive request
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="interactive-feed", daemon=True)
        self.taken = 0  # requests handed to the engine (tests, metrics)
        self.aborted_ids: list[str] = []  # request ids whose result came back aborted

    # -- the run's view ---------------------------------------------------------------------

    def start(self) -> InteractiveFeed:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)
        try:
            for gauge in (headroom_gauge(self.key), in_flight_gauge(self.key)):
                self.channels.gauge(gauge, self.reporter, 0, ttl=0.001)
        except Exception as exc:  # the broker is down: the gauges lapse on their own
            logger.warning(
                "interactive feed of %s: failed at its end: %s", self.key, exception_trace(exc)
            )
        with self._lock:
            left = list(self._inflight.values())
            self._inflight.clear()
            self._streams.clear()
        for submitted in left:  # the run ended under them (engine broken, budget): say so
            self._reply(submitted, "error", code=ItemCode.INTERNAL_ERROR)

    def owns(self, generation_id: str) -> bool:
        with self._lock:
            return generation_id in self._inflight

    def rows(self) -> int:
        """Rows the engine carries for interactive requests (the batch claims leave them)."""
        with self._lock:
            return self._rows

    def lingering(self) -> bool:
        """Whether the run should stay up for interactive work: some in flight, one waiting
        in the key's channel or popped and being prepared, or one taken within the linger
        time. A batch run that never saw one ends with its batch work, leaving the worker
        thread to other keys.

        When it answers False the feed takes nothing more: a request that comes later stays
        in the channel for the next run (its wake-up is sent again while this one ends,
        batches.execution.pipeline), never taken by a run that is ending and then answered
        with its end. The answer waits for a pop under way (POP_SECONDS at most)."""
        with self._intake:
            with self._lock:
                busy = bool(self._inflight)
            last = self._last
            recent = last is not None and (
                time.monotonic() - last < setting("INTERACTIVE_LINGER_SECONDS")
            )
            if busy or requests_waiting(self.key):
                return True
            # A recent request keeps the engine for the next, unless another model's
            # requests wait for a worker: lingering never holds the worker from them.
            if recent and not others_waiting(self.key):
                return True
            self._closed = True
            return False

    def aborted(self) -> frozenset[str]:
        """Generation ids nobody reads any more (refreshed by the feed's thread, and at once
        when a reply to one could not be delivered)."""
        with self._lock:
            if not self._undeliverable:
                return self._aborted
            return self._aborted | self._undeliverable

    def partial(self, partial: PartialResult) -> None:
        with self._lock:
            submitted = self._inflight.get(partial.id)
            stream = self._streams.get((partial.id, partial.index))
            if stream is None and submitted is not None and submitted.stream:
                # Made when the request was handed over; a choice without one reads plainly.
                stream = ReplyStream(dialect_of(self.tokenizer))
                self._streams[(partial.id, partial.index)] = stream
        if submitted is None or not submitted.stream or stream is None:
            return
        if isinstance(partial, RelayedPartial):
            # An external engine's server parted reasoning and answer already.
            reasoning, text = partial.reasoning, partial.text
        else:
            # The dialect splits the text into reasoning and answer; its markup is never sent.
            reasoning, text = stream.push(partial.text)
        if not (reasoning or text):
            return
        if not self._reply(submitted, "delta", index=partial.index, text=text, reasoning=reasoning):
            with self._lock:  # nobody can read it: stop it at the next step
                self._undeliverable.add(partial.id)

    def finished(self, result: GenerationResult) -> None:
        with self._lock:
            submitted = self._inflight.pop(result.id, None)
            self._undeliverable.discard(result.id)
            for index in range(result.params.n if result.params is not None else 1):
                self._streams.pop((result.id, index), None)
            if submitted is not None:
                self._rows -= result.params.n if result.params is not None else 1
        if submitted is None:
            return
        if result.aborted:
            self.aborted_ids.append(submitted.id)
        # The answer is read first, so that its usage's reasoning count is what is metered;
        # settling still comes before anything goes back, and before a failure to read it.
        body: dict[str, Any] | None = None
        unreadable: Exception | None = None
        reasoning = 0
        if not (result.aborted or result.error):
            try:
                body = result_body(
                    result,
                    completion_id=completion_id(submitted.id),
                    model=submitted.body["model"],
                    model_config_id=self.key.revision_id,
                    created=int(time.time()),
                    tokenizer=self.tokenizer,
                )
                reasoning = body["usage"]["completion_tokens_details"]["reasoning_tokens"]
            except Exception as exc:
                unreadable = exc
        try:
            interactive_settle(
                submitted, result, revision_id=self.key.revision_id, reasoning_tokens=reasoning
            )
        except Exception as exc:
            logger.error("interactive %s not settled: %s", submitted.id, exception_trace(exc))
            connection.close()
        if result.aborted:
            self._reply(submitted, "aborted")
        elif result.error:
            self._reply(submitted, "error", code=_reply_code(result.error))
        elif unreadable is not None:
            raise unreadable
        else:
            self._reply(submitted, "result", body=body)

    # -- the feed's thread --------------------------------------------------------------------

    def _loop(self) -> None:
        last_report = 0.0
        pause = RETRY_FIRST_SECONDS
        try:
            while not self._stopped.is_set():
                try:
                    if time.monotonic() - last_report >= HEADROOM_TTL_SECONDS / 4:
                        last_report = time.monotonic()
                        self._report()
                    busy = self._check_aborts()
                    with self._intake:
                        if self._closed:
                            break
                        self._pop_and_take(IN_FLIGHT_POP_SECONDS if busy else POP_SECONDS)
                    pause = RETRY_FIRST_SECONDS
                except Exception as exc:
                    # The broker (or the database) failed: the run goes on, and so does its
                    # feed, once it answers again. Type and frames only, as everywhere.
                    logger.warning(
                        "interactive feed of %s: retrying in %.2f s: %s",
                        self.key,
                        pause,
                        exception_trace(exc),
                    )
                    connection.close()
                    if self._stopped.wait(pause):
                        break
                    pause = min(RETRY_MOST_SECONDS, pause * 2)
        finally:
            connection.close()

    def _pop_and_take(self, timeout: float = POP_SECONDS) -> None:
        raw = self.channels.pop(request_channel(self.key), timeout=timeout)
        if raw is None:
            return
        self._last = time.monotonic()  # a run that saw a message lingers for the next
        try:
            submitted = Submitted.decode(raw)
        except (CryptoError, InvalidTag, ValueError, TypeError, KeyError) as exc:
            # Not sealed by a web process with our master keys: nobody to answer.
            logger.error("interactive request refused: %s", exception_trace(exc))
            return
        self._take(submitted)

    def _report(self) -> None:
        free = max(0, self.max_rows - self.engine_rows() - self.rows())
        self.channels.flag(feed_alive_flag(self.reporter), ttl=FEED_ALIVE_TTL_SECONDS)
        self.channels.gauge(headroom_gauge(self.key), self.reporter, free, ttl=HEADROOM_TTL_SECONDS)
        with self._lock:
            inflight = dict(self._inflight)
        self.channels.gauge(
            in_flight_gauge(self.key), self.reporter, len(inflight), ttl=HEADROOM_TTL_SECONDS
        )

    def _check_aborts(self) -> bool:
        """Refresh which requests in flight nobody reads any more; whether any is in flight."""
        with self._lock:
            inflight = dict(self._inflight)
        if inflight:
            aborts = {abort_flag(s.id): gid for gid, s in inflight.items()}
            listeners = {listener_flag(s.id): gid for gid, s in inflight.items()}
            raised = self.channels.flagged([*aborts, *listeners])
            self._aborted = frozenset(
                [gid for flag, gid in aborts.items() if flag in raised]
                + [gid for flag, gid in listeners.items() if flag not in raised]
            )
        return bool(inflight)

    def _take(self, submitted: Submitted) -> None:
        if submitted.deadline < time.time():
            logger.info("interactive %s dropped: its client stopped waiting", submitted.id)
            return
        flags = self.channels.flagged([abort_flag(submitted.id), listener_flag(submitted.id)])
        if abort_flag(submitted.id) in flags or listener_flag(submitted.id) not in flags:
            logger.info("interactive %s dropped: its client stopped waiting", submitted.id)
            return
        # Once only: a message pushed again (replayed) would run, and be settled, twice.
        ttl = max(1.0, submitted.deadline - time.time()) + 60
        if not self.channels.claim(taken_flag(submitted.id), ttl=ttl):
            logger.error("interactive %s refused: it was taken before", submitted.id)
            return
        try:
            ids = submitted.prompt_ids  # the web process's count: tokenized once
            if ids is None:
                ids = bounded_prompt_ids(
                    self.tokenizer, submitted.body, context_length=self.context_length
                )
            if ids is None or len(ids) > self.context_length:
                self._reply(submitted, "error", code=ItemCode.CONTEXT_LENGTH_EXCEEDED)
                return
            request = GenerationRequest(
                submitted.generation_id,
                ids,
                sampling_params(submitted.body, tokenizer=self.tokenizer, prompt=ids),
                cache_scope=_cache_scope(submitted),
                priority=INTERACTIVE_PRIORITY,
                stream=submitted.stream,
                # What an external engine relays (inference/external/engine.py), and until
                # when: the web process waits no longer (relay.replies).
                body=submitted.body,
                deadline=time.time() + setting("INTERACTIVE_TIMEOUT_SECONDS"),
            )
        except Exception as exc:
            # Type and frames only: a message could quote the request's content.
            logger.error("interactive %s not prepared: %s", submitted.id, exception_trace(exc))
            self._reply(submitted, "error", code=ItemCode.INTERNAL_ERROR)
            return
        with self._lock:
            self._inflight[request.id] = submitted
            self._rows += request.params.n
            if submitted.stream:
                dialect = dialect_of(self.tokenizer)
                opened = request.params.reasoning_opened
                calls = request.params.tool_calls is not None
                for index in range(request.params.n):
                    self._streams[(request.id, index)] = ReplyStream(
                        dialect, opened=opened, calls=calls
                    )
        self.taken += 1
        self._reply(submitted, "taken", worker=self.reporter)
        self.submit(request)

    def _reply(self, submitted: Submitted, kind: str, **fields: Any) -> bool:
        """Push one reply; whether it reached the broker."""
        try:
            self.channels.push(
                reply_channel(submitted.id),
                encode_reply(submitted, kind, **fields),
                ttl=REPLY_TTL_SECONDS,
            )
        except Exception as exc:
            logger.warning("reply to %s lost: %s", submitted.id, exception_trace(exc))
            return False
        return True


def _reply_code(error: str) -> str:
    """The error reply's code for a result's: an external engine's request that reached its
    deadline (the request's time limit, `batch_expired` in a batch) timed out."""
    return "timeout" if error == ItemCode.BATCH_EXPIRED else error


def _cache_scope(submitted: Submitted) -> str:
    """Prefix reuse stays within one organization (and deployment), as for batch rows."""
    if submitted.deployment_id:
        return f"{submitted.org_id}:{submitted.deployment_id}"
    return submitted.org_id


def interactive_refuse_waiting(key: EngineKey, *, code: str) -> int:
    """Answer every request waiting for `key` with the error `code` (its model cannot be
    loaded here): each at once, instead of after its wait for a worker. Returns how many.
    A request is answered once (its "taken" flag), and only while its web process waits."""
    ch = channels()
    answered = 0
    while (raw := ch.pop(request_channel(key), timeout=0.01)) is not None:
        try:
            submitted = Submitted.decode(raw)
        except (CryptoError, InvalidTag, ValueError, TypeError, KeyError) as exc:
            logger.error("interactive request refused: %s", exception_trace(exc))
            continue
        ttl = max(1.0, submitted.deadline - time.time()) + 60
        if not ch.claim(taken_flag(submitted.id), ttl=ttl):
            continue
        ch.push(
            reply_channel(submitted.id),
            encode_reply(submitted, "error", code=code),
            ttl=REPLY_TTL_SECONDS,
        )
        answered += 1
    return answered
