"""The external engine: a `GenerationEngine` (inference/engine/protocol.py) whose rows an
OpenAI-compatible server answers, so the worker's run drives a revision served elsewhere
exactly as it drives Boardwalk's own engine: `add`, `abort`, `step`.

`add` is safe from any thread and only queues: one background thread runs an asyncio loop,
and each row added becomes a task there that

- never sends a row at or past its deadline (`GenerationRequest.deadline`, the batch's
  expiry): it ends as `batch_expired`, the code an expired batch gives its unfinished rows;
- takes a slot of the revision's in-flight limit (`inference.external.limits`: held in Redis
  across worker processes when a Redis URL is given, in this process otherwise), waiting no
  later than the deadline, and gives it back with what the answer says of the upstream's load;
- posts the row's body (`GenerationRequest.body`, model replaced) with one shared
  `UpstreamClient`, and on a retryable outcome waits as `Backoff` says (`Retry-After` a
  floor, never past the deadline) and tries again, `max_attempts` sends in all. A batch row
  the server did not take (429, 503, no connection: nothing of it ran there) spends none of
  them: it waits out the storm or the outage until its deadline, so a batch finishes when the
  storm ends and expires with its partial results if the server stays away. An interactive
  row spends one on each, since its client is waiting.

`step(wait=…)` returns the results finished since the last step, waiting up to `wait` seconds
for the first; there is no local work, so `interrupt` is not needed. A success becomes one
`Choice` per upstream choice (the message's text, no token ids), with the server's `usage`
and its answer body (`GenerationResult.response`); `busy_seconds` is the row's share of the
server's GPU time: while n rows of the revision hold an in-flight slot, in any worker process,
each is counted 1/n of the elapsed time times the revision's declared GPUs (the limit's busy
clock, limits.py), so the shares add up to GPUs x the wall time during which at least one row
was in flight, overlap counted once across every worker (waits for a slot or a retry are not
counted; docs/BILLING.md).
`abort` cancels a row's task: a request in flight has its connection closed, which vLLM and
SGLang take as an abort, and the row comes back `aborted=True` (a stream cut so counts the
text that came: its prompt and those tokens are what it pays).

Interactive requests (`priority` > 0, added by the worker's interactive feed) go through the
same limit, backoff and deadline (the request's time limit) as batch rows, ahead of this
engine's batch rows waiting for a slot (`inference.external.priority`). One with `stream` is
sent with `stream: true` (`inference.external.streaming`): each piece of text the server
streams comes out of `step` at once as a `RelayedPartial`, and the assembled answer as the
result; a stream that fails before any text came is retried as any row, one that fails after
is not (its client has the text) and ends as its failure says (`exhausted_code`).

A row's failure is its own result (`contains_failures`): a final answer (4xx) ends it as
`invalid_request` (400, 413, 422), `context_length_exceeded` (the server says the prompt is
too long), or `internal_error` (the key refused, the model not served: the revision's
configuration, not the row); retries exhausted end it as `upstream_unavailable` when the
upstream stayed overloaded or out of reach, `internal_error` when it kept failing otherwise
(`exhausted_code`). An answer that breaks the row's `response_format` or `tools`
(`inference.external.validation`) ends it as `invalid_model_output`, not retried: the rule it
broke is logged, never the answer. `broken` is set only when the loop's thread dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from boardwalk.codes import ItemCode
from boardwalk.logs import exception_trace
from inference.engine.types import (
    FINISH_STOP,
    Choice,
    GenerationRequest,
    GenerationResult,
    PartialResult,
)
from inference.external.backoff import Backoff, may_send
from inference.external.client import Final, NotSent, Outcome, Retryable, Success, UpstreamClient
from inference.external.limits import (
    InFlightLimit,
    LocalInFlightLimit,
    RedisInFlightLimit,
    signal_of,
)
from inference.external.priority import Turns
from inference.external.streaming import Assembly, RelayedPartial, send_streaming
from inference.external.upstream import Upstream
from inference.external.validation import answer_violation
from inference.rendering import render_prompt, template_options

__all__ = ["ExternalEngine", "exhausted_code", "final_code"]

logger = logging.getLogger(__name__)

_REDIS_TIMEOUT_SECONDS = 10.0  # one in-flight-limit command (a script of a few operations)
_REDIS_CONNECTIONS = 32  # an engine's connections to the limit's Redis at most

_START_SECONDS = 30.0  # the loop thread builds its client and limit at once
_POLL_SECONDS = 0.5  # how often `generate` checks its abort set
_CLOSE_SECONDS = 10.0
# Upstream error codes and message words that say the prompt is longer than the context
# (vLLM, SGLang and OpenAI answer 400 with one of these).
_CONTEXT_CODES = frozenset({"context_length_exceeded", "context_window_exceeded"})
_CONTEXT_WORDS = ("maximum context length", "context length", "context window")


def final_code(outcome: Final) -> ItemCode:
    """The row's error code for a final upstream answer."""
    if outcome.status in (400, 413, 422):
        message = outcome.message.lower()
        if outcome.code in _CONTEXT_CODES or any(word in message for word in _CONTEXT_WORDS):
            return ItemCode.CONTEXT_LENGTH_EXCEEDED
        return ItemCode.INVALID_REQUEST
    # 401/403 (the key), 404 (the model or the URL), 3xx: the revision's upstream is
    # misconfigured, nothing the row could change.
    return ItemCode.INTERNAL_ERROR


def exhausted_code(outcome: Retryable) -> ItemCode:
    """The row's error code when its last attempt failed so: the upstream overloaded or out
    of reach (429, 502, 503, 504, timeouts, connection errors) is `upstream_unavailable`; a
    500 or an answer that is no chat completion on every attempt, `internal_error`."""
    if outcome.congestion or outcome.status == 502:
        return ItemCode.UPSTREAM_UNAVAILABLE
    return ItemCode.INTERNAL_ERROR


def limit_redis(url: str) -> Any:
    """The Redis client of an engine's in-flight limit. Its pool blocks: every row held
    renews and gives back its slot on its own connection, and a row that finds no free
    connection waits for one (at most `_REDIS_TIMEOUT_SECONDS`) instead of failing; a pool that
    raised when full failed rows as internal_error above about 50 in flight. A reply that
    never comes fails its row's send instead of holding it for ever."""
    import redis.asyncio as aioredis

    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=_REDIS_CONNECTIONS,
        timeout=_REDIS_TIMEOUT_SECONDS,
        socket_timeout=_REDIS_TIMEOUT_SECONDS,
        socket_connect_timeout=5,
    )
    return aioredis.Redis.from_pool(pool)  # closing the client closes its pool


class ExternalEngine:
    """A `GenerationEngine` for a revision served by an OpenAI-compatible server."""

    media_modalities: frozenset[str] = frozenset()
    contains_failures = True

    def __init__(
        self,
        upstream: Upstream,
        tokenizer: Any,
        *,
        max_in_flight: int,
        revision_id: str,
        redis_url: str | None = None,
        redis_prefix: str = "boardwalk:external",
        max_attempts: int = 3,
        backoff: Backoff | None = None,
        floor: int = 1,
        credit: int | None = None,
        gpus: int = 1,
    ) -> None:
        """`upstream`: where rows go (`Upstream.of(revision)`); `tokenizer`: the revision's,
        which counts a row's tokens when the server reports no usage; `max_in_flight`: the
        revision's cap, the in-flight limit's; `revision_id`: names the limit shared by every
        worker process in Redis (`redis_url`; None: a limit in this process alone);
        `max_attempts`: sends of one row at most, the first included; `gpus`: the GPUs the
        server declares for this revision (`ModelRevision.engine_gpus`), which the rows' busy
        time is counted in."""
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.upstream = upstream
        self.tokenizer = tokenizer
        self.max_batch_size = max_in_flight
        self.credit = credit or 2 * max_in_flight
        self.max_attempts = max_attempts
        self.broken = False
        self._backoff = backoff or Backoff()
        self._floor = min(floor, max_in_flight)
        self._revision_id = revision_id
        self._redis_url = redis_url
        self._redis_prefix = redis_prefix
        # Shared with the loop's thread, under `_ready`'s lock: ids added with no result
        # taken yet, and the results waiting for `step`.
        self._ready = threading.Condition()
        self._held: set[str] = set()
        self._dropped: set[str] = set()  # held rows a `generate` call left: no result wanted
        self._outbox: list[GenerationResult | PartialResult] = []
        self._closing = False
        # The loop's own (touched only from its thread).
        self._gpus = gpus  # the server's GPUs for this revision: its rows' busy time
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._client: UpstreamClient | None = None
        self._limit: InFlightLimit | None = None
        self._turns: Turns | None = None
        self._streams: dict[str, Assembly] = {}  # streamed rows' answers so far
        self._stop: asyncio.Event | None = None
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(started,), name="external-engine", daemon=True
        )
        self._thread.start()
        if not started.wait(_START_SECONDS) or self._start_error is not None:
            self.close()
            raise RuntimeError("the external engine's loop did not start") from self._start_error

    @classmethod
    def of(
        cls,
        revision: Any,
        tokenizer: Any,
        *,
        timeouts: dict[str, float] | None = None,
        **options: Any,
    ) -> ExternalEngine:
        """The engine of an external `ModelRevision`: its upstream (with `timeouts`,
        Upstream's), cap and id."""
        return cls(
            Upstream.of(revision, **(timeouts or {})),
            tokenizer,
            max_in_flight=revision.max_in_flight,
            revision_id=str(revision.id),
            gpus=revision.engine_gpus or 1,
            **options,
        )

    # -- the verbs ---------------------------------------------------------------------------

    @property
    def has_unfinished(self) -> bool:
        with self._ready:
            return bool(self._held or self._outbox)

    def add(self, request: GenerationRequest) -> None:
        """Queue a row; it is sent from the loop's thread and its result comes out of a
        later `step`. Safe from any thread."""
        with self._ready:
            if self.broken or self._closing:
                return  # never answered: the caller hands it back (as with a dead child)
            self._held.add(request.id)
        try:
            self._loop.call_soon_threadsafe(self._begin, request)
        except RuntimeError:  # the loop closed meanwhile (closed, or its thread died)
            with self._ready:
                self._held.discard(request.id)

    def abort(self, request_ids: Collection[str]) -> None:
        """Cancel these rows (those held); their results come back aborted. The loop runs
        callbacks in order, so a row added before is always found."""
        with self._ready:
            ids = [rid for rid in request_ids if rid in self._held]
            if not ids or self.broken or self._closing:
                return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self._loop.call_soon_threadsafe(self._cancel, ids)

    def step(
        self, *, wait: float = 0.0, interrupt: Callable[[], bool] | None = None
    ) -> list[GenerationResult | PartialResult]:
        """The results finished since the last step, waiting up to `wait` seconds for the
        first. Sets `broken` when the loop's thread has died; what was held is then the
        caller's to hand back."""
        with self._ready:
            if not self._outbox and wait > 0 and not self.broken:
                self._ready.wait(wait)
            outputs, self._outbox = self._outbox, []
            if self.broken:
                self._held.clear()
            return outputs

    def generate(
        self,
        requests: Iterable[GenerationRequest],
        /,
        *,
        aborted: Callable[[], Collection[str]] | None = None,
    ) -> Iterator[GenerationResult | PartialResult]:
        """A loop over the verbs: requests added up to `credit` ahead of their results,
        results yielded as they finish. A call its caller abandons aborts what it left."""
        source = iter(requests)
        exhausted = False
        mine: set[str] = set()
        sent_abort: set[str] = set()
        try:
            while True:
                while not exhausted and len(mine) < self.credit:
                    request = next(source, None)
                    if request is None:
                        exhausted = True
                        break
                    mine.add(request.id)
                    self.add(request)
                if exhausted and not mine:
                    return
                if aborted is not None:
                    ids = (set(aborted()) & mine) - sent_abort
                    if ids:
                        sent_abort |= ids
                        self.abort(ids)
                for output in self.step(wait=_POLL_SECONDS):
                    if isinstance(output, GenerationResult):
                        mine.discard(output.id)
                    yield output
                if self.broken:
                    return
        finally:
            if mine and not self.broken:
                # The caller stopped mid-run: what it left is aborted, and its results
                # dropped when they come.
                with self._ready:
                    self._dropped |= mine & self._held
                self.abort(mine)

    def clear_prefix_cache(self) -> None:
        """Nothing is cached here (the server keeps its own prefix cache)."""

    def close(self) -> None:
        """Cancel every row (no results), close the client and the limit's Redis
        connection, and end the loop's thread."""
        with self._ready:
            self._closing = True
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already closed
                self._loop.call_soon_threadsafe(self._request_stop)
            self._thread.join(timeout=_CLOSE_SECONDS)

    def __enter__(self) -> ExternalEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop's thread -------------------------------------------------------------------

    def _run(self, started: threading.Event) -> None:
        try:
            self._loop.run_until_complete(self._main(started))
        except BaseException as exc:
            self._start_error = exc
            logger.error("external engine loop died: %s", exception_trace(exc))
        finally:
            with self._ready:
                if not self._closing:
                    self.broken = True
                    self._closing = True  # rows cancelled below give no results
                self._ready.notify_all()
            self._abandon()
            started.set()
            self._loop.close()

    def _abandon(self) -> None:
        """After the loop stopped abruptly, best effort: cancel what it held, `_main` with
        it, whose end cancels the rows (closing their connections) and closes the client.
        A loop that ended through `close` holds nothing."""
        tasks = [task for task in asyncio.all_tasks(self._loop) if not task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))

    async def _main(self, started: threading.Event) -> None:
        self._stop = asyncio.Event()
        self._limit, redis = self._make_limit()
        self._turns = Turns(self._limit)
        self._client = UpstreamClient(self.upstream, max_connections=2 * self.max_batch_size)
        started.set()
        try:
            await self._stop.wait()
        finally:
            tasks = list(self._tasks.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._client.aclose()
            if redis is not None:
                await redis.aclose()

    def _make_limit(self) -> tuple[InFlightLimit, Any]:
        cap, floor = self.max_batch_size, self._floor
        if not self._redis_url:
            return LocalInFlightLimit(cap=cap, floor=floor), None
        redis = limit_redis(self._redis_url)
        limit = RedisInFlightLimit(
            redis, self._revision_id, cap=cap, floor=floor, prefix=self._redis_prefix
        )
        return limit, redis

    def _request_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def _begin(self, request: GenerationRequest) -> None:
        task = self._loop.create_task(self._row(request))
        self._tasks[request.id] = task
        task.add_done_callback(lambda done: self._settled(request, done))

    def _settled(self, request: GenerationRequest, task: asyncio.Task[None]) -> None:
        """A row's task ended. One cancelled before it first ran (an abort right behind its
        `add`, as a stopping batch's row gets) never reached `_row`'s handler: it ends
        aborted here, or it would be held for ever."""
        self._tasks.pop(request.id, None)
        with self._ready:
            closing = self._closing
        if task.cancelled() and not closing:
            self._finish(_ended(request, 0.0, aborted=True))

    def _cancel(self, ids: list[str]) -> None:
        for rid in ids:
            task = self._tasks.get(rid)
            if task is not None:
                task.cancel()

    def _finish(self, result: GenerationResult) -> None:
        with self._ready:
            if result.id not in self._held:
                return
            self._held.discard(result.id)
            if result.id in self._dropped:
                self._dropped.discard(result.id)
                return
            self._outbox.append(result)
            self._ready.notify_all()

    async def _row(self, request: GenerationRequest) -> None:
        busy = [0.0]
        try:
            result = await self._dispatch(request, busy)
        except asyncio.CancelledError:
            with self._ready:
                closing = self._closing
            if closing:
                raise
            result = _ended(
                request, busy[0], aborted=True, completion_tokens=self._streamed(request.id)
            )
        except Exception as exc:
            logger.error("external row %s failed: %s", request.id, exception_trace(exc))
            result = _ended(request, busy[0], error=ItemCode.INTERNAL_ERROR)
        finally:
            self._streams.pop(request.id, None)
        if not result.choices and not request.prompt_ids and busy[0] > 0:
            # A batch row carries no prompt ids (the worker does not tokenize rows a server
            # answers): one that reached the server and failed or was aborted reports its
            # prompt as a local engine's does, counted here, off the path of answered rows.
            with contextlib.suppress(Exception):
                result = dataclasses.replace(result, prompt_tokens=self._prompt_tokens(request))
        self._finish(result)

    async def _dispatch(self, request: GenerationRequest, busy: list[float]) -> GenerationResult:
        client, turns = self._client, self._turns
        if client is None or turns is None:
            raise RuntimeError("the loop has no client yet")
        if request.body is None:
            logger.error("external row %s has no body to send", request.id)
            return _ended(request, 0.0, error=ItemCode.INVALID_REQUEST)
        deadline = request.deadline
        failures = 0  # attempts spent (module doc)
        waits = 0  # retries so far: the backoff grows with them
        while True:
            if not may_send(time.time(), deadline):
                return _ended(request, busy[0], error=ItemCode.BATCH_EXPIRED)
            held = None
            try:
                async with turns.held(priority=request.priority, deadline=deadline) as held:
                    if held is None:  # no slot before the deadline
                        return _ended(request, busy[0], error=ItemCode.BATCH_EXPIRED)
                    outcome = await self._send(client, request, deadline)
                    held.report(signal_of(outcome))
            finally:
                if held is not None:  # its share of the server's busy time (limits.py)
                    busy[0] += held.busy_seconds * self._gpus
            if isinstance(outcome, Retryable) and request.id in self._streams:
                # Its text already went to the client: the answer cannot be asked again.
                logger.warning("external row %s: its stream broke off", request.id)
                return _ended(
                    request,
                    busy[0],
                    error=exhausted_code(outcome),
                    completion_tokens=self._streamed(request.id),
                )
            if isinstance(outcome, Success):
                broken = answer_violation(request.body, outcome.body)
                if broken is not None:  # the rule only: never the answer's text
                    code = ItemCode.INVALID_MODEL_OUTPUT
                    logger.warning("external row %s: %s -> %s", request.id, broken, code)
                    return _ended(request, busy[0], error=code)
                return self._succeeded(request, outcome.body, busy[0])
            if isinstance(outcome, NotSent):
                return _ended(request, busy[0], error=ItemCode.BATCH_EXPIRED)
            if isinstance(outcome, Final):
                code = final_code(outcome)
                logger.warning("external row %s: %s -> %s", request.id, outcome.log_text(), code)
                return _ended(request, busy[0], error=code)
            if outcome.reason == "deadline":
                return _ended(request, busy[0], error=ItemCode.BATCH_EXPIRED)
            waits += 1
            # A batch row waits out an overloaded or unreachable server until its deadline
            # (the batch then expires with its partial results); an interactive one, whose
            # client waits, has its attempts.
            if not (outcome.not_taken and request.priority <= 0):
                failures += 1
            if failures >= self.max_attempts:
                logger.warning(
                    "external row %s: %d attempts, the last %s (%s)",
                    request.id,
                    failures,
                    outcome.reason,
                    outcome.status,
                )
                return _ended(request, busy[0], error=exhausted_code(outcome))
            at = self._backoff.retry_at(
                time.time(), waits, deadline=deadline, retry_after=outcome.retry_after
            )
            if at is None:  # the retry would start past the deadline: not made
                return _ended(request, busy[0], error=ItemCode.BATCH_EXPIRED)
            await asyncio.sleep(max(0.0, at - time.time()))

    async def _send(
        self, client: UpstreamClient, request: GenerationRequest, deadline: float | None
    ) -> Outcome:
        """One attempt: the answer whole, or streamed piece by piece (a stream that sent
        text is noted in `_streams`, and its pieces are in the outbox)."""
        body = request.body or {}
        if not request.stream:
            return await client.send(body, deadline=deadline)
        assembly = Assembly()

        def delta(index: int, text: str, reasoning: str) -> None:
            self._streams[request.id] = assembly
            self._partial(RelayedPartial(request.id, index, text, reasoning=reasoning))

        streamed = await send_streaming(
            client, body, deadline=deadline, on_delta=delta, assembly=assembly
        )
        return streamed.outcome

    def _partial(self, partial: RelayedPartial) -> None:
        with self._ready:
            if partial.id not in self._held or partial.id in self._dropped:
                return
            self._outbox.append(partial)
            self._ready.notify_all()

    def _streamed(self, request_id: str) -> int:
        """Completion tokens of the text a cut stream had sent (0 for no stream)."""
        assembly = self._streams.get(request_id)
        if assembly is None:
            return 0
        return _token_count(self.tokenizer, assembly.streamed_text())

    def _succeeded(
        self, request: GenerationRequest, body: dict[str, Any], busy: float
    ) -> GenerationResult:
        choices = []
        texts = []
        for position, entry in enumerate(body["choices"]):
            entry = _object(entry)
            message = _object(entry.get("message"))
            content = message.get("content")
            text = content if isinstance(content, str) else ""
            index = entry.get("index")
            choices.append(
                Choice(
                    index=index if isinstance(index, int) else position,
                    token_ids=[],
                    text=text,
                    finish_reason=str(entry.get("finish_reason") or FINISH_STOP),
                    logprobs=None,
                )
            )
            texts.append(_generated_text(message))
        choices.sort(key=lambda choice: choice.index)
        usage = _object(body.get("usage"))
        prompt_tokens = _count(usage.get("prompt_tokens"))
        if prompt_tokens is None:
            prompt_tokens = self._prompt_tokens(request)
        completion_tokens = _count(usage.get("completion_tokens"))
        if completion_tokens is None:
            completion_tokens = sum(_token_count(self.tokenizer, text) for text in texts)
        cached = _count(_object(usage.get("prompt_tokens_details")).get("cached_tokens"))
        return GenerationResult(
            id=request.id,
            choices=choices,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=min(cached or 0, prompt_tokens),
            busy_seconds=busy,
            params=request.params,
            response=body,
        )

    def _prompt_tokens(self, request: GenerationRequest) -> int:
        """The prompt's tokens when the server reports none: the ids the worker rendered
        with the revision's chat template, or the body rendered with it here."""
        if request.prompt_ids:
            return len(request.prompt_ids)
        body = request.body or {}
        return len(
            render_prompt(
                self.tokenizer,
                body.get("messages") or [],
                body.get("tools") or None,
                template_options(self.tokenizer, body),
            )
        )


def _object(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one (a server's answer is read
    leniently: a field of the wrong type counts as absent)."""
    return value if isinstance(value, dict) else {}


def _count(value: Any) -> int | None:
    """A usage count as the server gave it, or None when absent or not a count."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _generated_text(message: dict[str, Any]) -> str:
    """What the model generated in a choice, for counting when the server reports no usage:
    the reasoning (vLLM's and SGLang's `reasoning_content`, or `reasoning`), the content,
    and each tool call's name and arguments. The server's markup around them is not in the
    answer, so the count can fall a few tokens short of what the model produced."""
    parts = []
    for key in ("reasoning_content", "reasoning", "content"):
        value = message.get(key)
        if isinstance(value, str):
            parts.append(value)
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts.extend(str(function.get(key) or "") for key in ("name", "arguments"))
    return "".join(parts)


def _token_count(tokenizer: Any, text: str) -> int:
    """Tokens of `text` under the revision's tokenizer, no special tokens added (the web
    tier's ChatTokenizer encodes with its backend, a transformers tokenizer directly)."""
    if not text:
        return 0
    encode = getattr(tokenizer, "encode", None)
    if encode is not None:
        return len(encode(text, add_special_tokens=False))
    return len(tokenizer.backend.encode(text, add_special_tokens=False).ids)


def _ended(
    request: GenerationRequest,
    busy: float,
    *,
    aborted: bool = False,
    error: str | None = None,
    completion_tokens: int = 0,
) -> GenerationResult:
    """A row with no answer: aborted, or in error with `error`'s code (`completion_tokens`:
    what a stream cut short had generated)."""
    return GenerationResult(
        id=request.id,
        choices=[],
        prompt_tokens=len(request.prompt_ids),
        completion_tokens=completion_tokens,
        cached_tokens=0,
        busy_seconds=busy,
        aborted=aborted,
        error=error,
        params=request.params,
    )
