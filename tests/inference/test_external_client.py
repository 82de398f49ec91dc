"""The external-engine client (issue 41, first slice): a real `transformers serve` serving the
tiny demo model built locally, and a fault-injecting proxy in front of it for what a server
does on a bad day (429/503 bursts with Retry-After, cut connections, answers cut in half,
stalls). Checks how each outcome is classified, the in-flight limit's AIMD and its bound
across two workers (two limiter instances on one Redis), the backoff and the deadline rule.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from inference.external.backoff import Backoff, may_send
from inference.external.client import (
    Final,
    NotSent,
    Retryable,
    Success,
    UpstreamClient,
    retry_after_seconds,
)
from inference.external.limits import (
    InFlightLimit,
    LocalInFlightLimit,
    RedisInFlightLimit,
    Signal,
    signal_of,
)
from inference.external.upstream import (
    Upstream,
    UpstreamConfigError,
    api_key_env_refusal,
    api_key_from_environment,
    normalized_url,
)
from tests.conftest import redis_only
from tests.inference.upstreams import (
    FaultProxy,
    Served,
    cut,
    cut_body,
    free_port,
    serve,
    stall,
    status,
)

ROW = {
    "model": "acme/big",
    "messages": [{"role": "user", "content": "Say hello."}],
    "max_tokens": 3,
    "temperature": 0,
}
SECRET_PROMPT = "the row's private words"


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(tiny_model_dir, tmp_path_factory.mktemp("serve")) as running:
        yield running


@pytest.fixture
def proxy(served: Served) -> Iterator[FaultProxy]:
    with FaultProxy(served.url.removesuffix("/v1")) as running:
        yield running


def send_all(upstream: Upstream, bodies: list[dict[str, Any]], **options: Any) -> list[Any]:
    """Each body sent once through one client, all at once; the outcomes in order."""

    async def go() -> list[Any]:
        async with UpstreamClient(upstream) as client:
            return list(await asyncio.gather(*(client.send(b, **options) for b in bodies)))

    return asyncio.run(go())


def upstream_of(proxy: FaultProxy, served: Served, **options: Any) -> Upstream:
    """The served model through the proxy; a minute per request, so that a server gone
    wrong fails the test instead of holding it for the five-minute default."""
    return Upstream(url=proxy.url, model=served.model, **({"request_timeout": 60.0} | options))


# -- the server itself ---------------------------------------------------------------------


def test_a_row_reaches_the_server_with_its_model_id_and_comes_back(proxy, served):
    [outcome] = send_all(upstream_of(proxy, served), [ROW | {"stream": True}])
    assert isinstance(outcome, Success)
    assert outcome.body["object"] == "chat.completion"
    assert outcome.body["choices"][0]["message"]["role"] == "assistant"
    assert outcome.body["usage"]["completion_tokens"] >= 1
    [sent] = proxy.posts()
    assert sent["path"] == "/v1/chat/completions"
    # The engine's model id replaces the row's; the client asks for one JSON answer.
    assert sent["json"]["model"] == served.model and "stream" not in sent["json"]
    assert sent["json"]["messages"] == ROW["messages"]


def test_one_process_drives_many_rows_at_once_under_its_limit(served):
    """24 rows through one client and a limit of 6: all answered, never more than 6 at the
    server at once, and several at once (the proxy holds each a moment)."""
    limit = LocalInFlightLimit(cap=6)

    async def one(client: UpstreamClient, index: int) -> Any:
        async with limit.held() as held:
            assert held is not None
            outcome = await client.send(ROW | {"seed": index})
            held.report(signal_of(outcome))
            return outcome

    async def go(upstream: Upstream) -> list[Any]:
        async with UpstreamClient(upstream, max_connections=64) as client:
            return list(await asyncio.gather(*(one(client, i) for i in range(24))))

    with FaultProxy(served.url.removesuffix("/v1"), delay=0.2) as slow:
        outcomes = asyncio.run(go(upstream_of(slow, served)))
        assert all(isinstance(o, Success) for o in outcomes)
        assert len(slow.posts()) == 24
        assert 2 <= slow.max_in_flight <= 6
    assert asyncio.run(limit.state()) == (6, 0)  # every slot back, the limit at its cap


# -- how outcomes are classified -----------------------------------------------------------


def test_overload_answers_are_retryable_congestion_with_retry_after(proxy, served):
    when = email.utils.formatdate(time.time() + 120, usegmt=True)
    proxy.plan(status(429, retry_after="7"), status(503, retry_after=when), status(504))
    outcomes = [send_all(upstream_of(proxy, served), [ROW])[0] for _ in range(3)]
    assert [(o.reason, o.status) for o in outcomes] == [
        ("rate_limited", 429),
        ("unavailable", 503),
        ("timeout", 504),
    ]
    assert all(isinstance(o, Retryable) and o.congestion for o in outcomes)
    assert outcomes[0].retry_after == 7.0
    assert 100 < outcomes[1].retry_after <= 120  # an HTTP date, as seconds from now
    assert outcomes[2].retry_after is None


def test_other_server_errors_are_retryable_without_halving(proxy, served):
    proxy.plan(status(500), status(502, retry_after="2"))
    first, second = (send_all(upstream_of(proxy, served), [ROW])[0] for _ in range(2))
    assert first == Retryable("server_error", 500, None)
    assert second == Retryable("server_error", 502, 2.0)
    assert not first.congestion and signal_of(first) is Signal.NEUTRAL


def test_cut_connections_and_half_answers_are_retryable_connection_errors(proxy, served):
    proxy.plan(cut(), cut_body())
    first, second = (send_all(upstream_of(proxy, served), [ROW])[0] for _ in range(2))
    assert first == Retryable("connection") and second == Retryable("connection")
    assert signal_of(first) is Signal.CONGESTION
    # Nothing was lost on the way: the next request reaches the server again.
    assert isinstance(send_all(upstream_of(proxy, served), [ROW])[0], Success)


def test_a_refused_connection_is_an_unreachable_server_that_took_nothing():
    upstream = Upstream(url=f"http://127.0.0.1:{free_port()}/v1", model="m")
    [outcome] = send_all(upstream, [ROW])
    assert outcome == Retryable("unreachable")
    assert outcome.congestion and outcome.not_taken


def test_a_stalled_answer_is_cut_at_the_rows_deadline_without_halving(proxy, served):
    proxy.plan(stall())
    [outcome] = send_all(upstream_of(proxy, served), [ROW], deadline=time.time() + 1.0)
    assert outcome == Retryable("deadline") and not outcome.congestion


def test_a_stalled_answer_times_out_at_the_request_timeout(proxy, served):
    proxy.plan(stall())
    upstream = upstream_of(proxy, served, request_timeout=1.0)
    [outcome] = send_all(upstream, [ROW], deadline=time.time() + 60)
    assert outcome == Retryable("timeout") and outcome.congestion


def test_a_2xx_that_is_no_chat_completion_is_retried(proxy, served):
    proxy.plan(status(200, body={"nothing": True}), status(200, body=[1, 2]))
    outcomes = [send_all(upstream_of(proxy, served), [ROW])[0] for _ in range(2)]
    assert outcomes == [Retryable("invalid_response", 200)] * 2


def test_client_errors_are_final_and_their_message_stays_out_of_logs(proxy, served, caplog):
    said = {"error": {"message": f"bad request: {SECRET_PROMPT}", "code": "invalid_value"}}
    proxy.plan(status(400, body=said), status(422, body={"detail": SECRET_PROMPT}))
    with caplog.at_level(logging.DEBUG):
        first, second = (send_all(upstream_of(proxy, served), [ROW])[0] for _ in range(2))
    assert isinstance(first, Final) and (first.status, first.code) == (400, "invalid_value")
    assert SECRET_PROMPT in first.message  # kept for the row's error…
    assert SECRET_PROMPT not in repr(first) and SECRET_PROMPT not in first.log_text()
    assert first.log_text() == "upstream answered 400 (invalid_value)"
    assert second == Final(422, None, SECRET_PROMPT) and SECRET_PROMPT not in repr(second)
    assert SECRET_PROMPT not in caplog.text  # …never logged on the way
    assert signal_of(first) is Signal.NEUTRAL


def test_the_api_key_is_sent_as_a_bearer_token_and_kept_out_of_reprs(served):
    with FaultProxy(served.url.removesuffix("/v1"), api_key="sk-right") as guarded:
        right = upstream_of(guarded, served, api_key="sk-right")
        assert "sk-right" not in repr(right)
        assert isinstance(send_all(right, [ROW])[0], Success)
        wrong = send_all(upstream_of(guarded, served, api_key="sk-wrong"), [ROW])[0]
        assert isinstance(wrong, Final) and wrong.status == 401
        assert [s["authorization"] for s in guarded.posts()] == [
            "Bearer sk-right",
            "Bearer sk-wrong",
        ]


# -- deadlines and backoff -----------------------------------------------------------------


def test_a_row_past_its_deadline_is_never_sent(proxy, served):
    outcomes = send_all(upstream_of(proxy, served), [ROW], deadline=time.time() - 1)
    assert outcomes == [NotSent("deadline")]
    assert proxy.seen == []
    assert not may_send(100.0, 100.0) and may_send(99.9, 100.0) and may_send(1e12, None)


def test_backoff_grows_with_jitter_up_to_its_cap():
    backoff = Backoff(base_seconds=2, cap_seconds=30)
    rng = random.Random(41)  # noqa: S311 (jitter, not secrets)
    for failures, ceiling in [(1, 2), (2, 4), (3, 8), (4, 16), (5, 30), (40, 30)]:
        delays = [backoff.delay(failures, rng=rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 100  # jittered: workers retrying together spread out
    with pytest.raises(ValueError):
        backoff.delay(0)
    with pytest.raises(ValueError):
        Backoff(base_seconds=5, cap_seconds=1)


def test_backoff_honours_retry_after_but_never_past_the_deadline():
    backoff = Backoff(base_seconds=2, cap_seconds=30, max_retry_after_seconds=300)
    rng = random.Random(7)  # noqa: S311 (jitter, not secrets)
    assert backoff.delay(1, retry_after=20, rng=rng) == 20  # the server's wait is a floor
    assert 1 <= backoff.delay(1, retry_after=0.5, rng=rng) <= 2  # shorter: ours
    assert backoff.delay(1, retry_after=3600, rng=rng) == 300  # capped
    now = 1_000_000.0
    assert backoff.retry_at(now, 1, deadline=now + 60, retry_after=20, rng=rng) == now + 20
    # The retry would start at or after the deadline: it is not made.
    assert backoff.retry_at(now, 1, deadline=now + 20, retry_after=20, rng=rng) is None
    assert backoff.retry_at(now, 5, deadline=now + 10, rng=rng) is None
    assert backoff.retry_at(now, 1, deadline=None, rng=rng) is not None


def test_a_429_storm_is_ridden_out_within_attempts_and_deadline(proxy, served):
    """A retry loop made of the parts (the dispatch the worker will run): the storm's
    Retry-After is honoured, the limit halves once for the storm, the row succeeds after."""
    proxy.plan(*[status(429, retry_after="0") for _ in range(3)])
    limit = LocalInFlightLimit(cap=8)
    backoff = Backoff(base_seconds=0.01, cap_seconds=0.05)
    deadline = time.time() + 60

    async def dispatch() -> tuple[Any, int]:
        async with UpstreamClient(upstream_of(proxy, served)) as client:
            for attempt in range(1, 6):
                async with limit.held(deadline=deadline) as held:
                    assert held is not None
                    outcome = await client.send(ROW, deadline=deadline)
                    held.report(signal_of(outcome))
                if not isinstance(outcome, Retryable):
                    return outcome, attempt
                at = backoff.retry_at(
                    time.time(), attempt, deadline=deadline, retry_after=outcome.retry_after
                )
                assert at is not None
                await asyncio.sleep(max(0.0, at - time.time()))
        raise AssertionError("the storm outlasted the attempts")

    outcome, attempts = asyncio.run(dispatch())
    assert isinstance(outcome, Success) and attempts == 4
    # 8 halved on each 429 (each a new epoch, one at a time), then +1 on the success.
    assert asyncio.run(limit.state()) == (2, 0)


# -- the in-flight limit -------------------------------------------------------------------


def _aimd(limit: InFlightLimit) -> None:
    async def go() -> None:
        assert await limit.state() == (8, 0)
        taken = [await limit.try_acquire() for _ in range(8)]
        assert all(taken) and await limit.try_acquire() is None  # the cap holds
        assert await limit.state() == (8, 8)
        # A storm: every slot of the epoch fails, the limit halves once.
        for slot in taken[:3]:
            assert slot is not None
            await limit.release(slot, Signal.CONGESTION)
        assert await limit.state() == (4, 5)
        assert await limit.try_acquire() is None  # 5 in flight, limit 4
        for slot in taken[3:]:
            assert slot is not None
            await limit.release(slot, Signal.NEUTRAL)
        # A slot of the new epoch failing halves it again, down to the floor and no further.
        for expected in (2, 2):
            slot = await limit.try_acquire()
            assert slot is not None
            await limit.release(slot, Signal.CONGESTION)
            assert (await limit.state())[0] == expected
        # Successes add one each, up to the cap.
        for _ in range(10):
            slot = await limit.try_acquire()
            assert slot is not None
            await limit.release(slot, Signal.SUCCESS)
        assert await limit.state() == (8, 0)
        if isinstance(limit, RedisInFlightLimit):
            await limit._redis.aclose()

    asyncio.run(go())


def test_the_limit_halves_once_per_storm_and_grows_by_one_locally():
    _aimd(LocalInFlightLimit(cap=8, floor=2))
    with pytest.raises(ValueError):
        LocalInFlightLimit(cap=2, floor=3)


def test_a_waiter_gets_the_slot_given_back_or_none_at_its_deadline():
    limit = LocalInFlightLimit(cap=1)

    async def go() -> tuple[Any, Any]:
        first = await limit.try_acquire()
        assert first is not None
        late = await limit.acquire(deadline=time.time() + 0.1)

        async def give_back() -> None:
            await asyncio.sleep(0.05)
            await limit.release(first, Signal.SUCCESS)
            limit._notify()

        waiting = asyncio.create_task(limit.acquire(deadline=time.time() + 30))
        await give_back()
        return late, await waiting

    late, got = asyncio.run(go())
    assert late is None and got is not None


@pytest.fixture
def redis_limits() -> Iterator[Any]:
    """Factory of Redis-held limits on one revision key, each with its own connection (as
    two worker processes would have)."""
    import redis.asyncio as aioredis

    revision = f"mcfg_test_{uuid.uuid4().hex}"

    def make(**options: Any) -> RedisInFlightLimit:
        client = aioredis.Redis.from_url(django_settings.REDIS_URL, socket_timeout=10)
        return RedisInFlightLimit(client, revision, prefix="boardwalk-test:external", **options)

    yield make
    import redis

    sync = redis.Redis.from_url(django_settings.REDIS_URL)
    sync.delete(f"boardwalk-test:external:{revision}:slots")
    sync.delete(f"boardwalk-test:external:{revision}:state")
    sync.close()


@redis_only
def test_the_redis_held_limit_adapts_as_the_local_one(redis_limits):
    _aimd(redis_limits(cap=8, floor=2))


@redis_only
def test_two_workers_share_one_bound_and_one_window(redis_limits):
    async def go() -> None:
        one, two = redis_limits(cap=3), redis_limits(cap=3)
        a = await one.try_acquire()
        b = await one.try_acquire()
        c = await two.try_acquire()
        assert a and b and c
        assert await two.try_acquire() is None and await one.try_acquire() is None
        assert await one.state() == await two.state() == (3, 3)
        await one.release(a, Signal.CONGESTION)  # halved for both workers
        assert await two.state() == (1, 2)
        await two.release(c, Signal.CONGESTION)  # the same epoch's: not halved again
        assert await one.state() == (1, 1)
        assert await two.try_acquire() is None  # 1 in flight, limit 1
        await one.release(b, Signal.SUCCESS)
        assert await two.state() == (2, 0)
        for limit in (one, two):
            await limit._redis.aclose()

    asyncio.run(asyncio.wait_for(go(), 60))  # a hang guard, not a timing


@redis_only
def test_two_workers_rows_share_the_servers_busy_time_once(redis_limits):
    """Rows of two worker processes in flight together share the time: their shares add up to
    the time any was in flight (measured on the Redis server's clock), not to their sum."""
    import redis

    sync = redis.Redis.from_url(django_settings.REDIS_URL)

    def server_seconds() -> float:
        seconds, micros = sync.time()
        return seconds + micros / 1e6

    async def go() -> tuple[list[float], float]:
        one, two = redis_limits(cap=8), redis_limits(cap=8)

        async def row(limit: RedisInFlightLimit, hold: float) -> float:
            async with limit.held() as held:
                assert held is not None
                await asyncio.sleep(hold)
            return held.busy_seconds

        began = server_seconds()
        shares = await asyncio.gather(row(one, 0.4), row(one, 0.4), row(two, 0.4), row(two, 0.2))
        spent = server_seconds() - began
        for limit in (one, two):
            await limit._redis.aclose()
        return list(shares), spent

    shares, spent = asyncio.run(asyncio.wait_for(go(), 60))  # a hang guard, not a timing
    sync.close()
    # Four rows over about 0.4 s: the sum is the busy time (at most the whole span), not 1.4 s.
    assert sum(shares) <= spent
    assert sum(shares) >= 0.4 * 0.9  # the longest row's hold, the clock's ms rounding aside
    assert shares[3] < shares[0]  # the short row shared only its 0.2 s


@redis_only
def test_many_rows_waiting_for_slots_never_run_out_of_redis_connections():
    """Hundreds of rows of one engine wait for a slot at once: they ask Redis one at a time,
    on the engine's bounded pool, and every one gets its turn (a pool that raised when full
    failed rows as internal_error above about 50 in flight)."""
    from inference.external.engine import limit_redis

    revision = f"mcfg_test_{uuid.uuid4().hex}"

    async def go() -> int:
        redis = limit_redis(django_settings.REDIS_URL)
        limit = RedisInFlightLimit(redis, revision, cap=96, prefix="boardwalk-test:external")
        limit.poll_seconds = 0.005  # waiters ask often: the load the bound must survive

        async def row() -> bool:
            async with limit.held() as held:
                await asyncio.sleep(0.01)
                return held is not None

        done = await asyncio.gather(*(row() for _ in range(400)))
        await redis.aclose()
        return sum(done)

    try:
        assert asyncio.run(asyncio.wait_for(go(), 120)) == 400  # a hang guard, not a timing
    finally:
        import redis as sync_redis

        sync = sync_redis.Redis.from_url(django_settings.REDIS_URL)
        sync.delete(f"boardwalk-test:external:{revision}:slots")
        sync.delete(f"boardwalk-test:external:{revision}:state")
        sync.close()


@redis_only
def test_slots_of_a_killed_worker_lapse(redis_limits):
    """A worker killed with kill -9 never gives its slots back: they lapse after the TTL,
    while a live worker's slot (renewed by `held`) does not."""

    async def go() -> None:
        killed = redis_limits(cap=2, ttl_seconds=0.3)
        live = redis_limits(cap=2, ttl_seconds=0.3, poll_seconds=0.02)
        assert await killed.try_acquire() is not None  # never released, never renewed
        async with live.held() as kept:
            assert kept is not None
            assert await live.try_acquire() is None  # both slots taken
            # The killed worker's slot lapses, and this one waits for it.
            async with live.held(deadline=time.time() + 10) as second:
                assert second is not None
                await asyncio.sleep(0.5)  # past the TTL: `held` renews both, still full
                assert await live.try_acquire() is None
        assert await live.state() == (2, 0)
        for limit in (killed, live):
            await limit._redis.aclose()

    asyncio.run(asyncio.wait_for(go(), 60))  # a hang guard, not a timing


# -- where the upstream is -----------------------------------------------------------------


def test_engine_urls_and_key_variables_are_checked(monkeypatch):
    assert normalized_url("http://vllm-head:8000/v1/") == "http://vllm-head:8000/v1"
    for bad, said in [
        ("vllm-head:8000/v1", "not an http(s) URL"),
        ("ftp://host/v1", "not an http(s) URL"),
        ("http://user:sk-secret@host/v1", "must not carry credentials"),
        ("http://host/v1?key=sk", "no query"),
    ]:
        with pytest.raises(UpstreamConfigError, match=re.escape(said)):
            normalized_url(bad)
    assert api_key_env_refusal("VLLM_API_KEY") is None
    assert "Boardwalk's own settings" in (api_key_env_refusal("BOARDWALK_MASTER_KEYS") or "")
    assert "Boardwalk's own settings" in (api_key_env_refusal("DJANGO_SECRET_KEY") or "")
    assert "not an environment variable name" in (api_key_env_refusal("A-B") or "")
    assert api_key_from_environment("") is None
    monkeypatch.delenv("EXT_TEST_KEY", raising=False)
    with pytest.raises(UpstreamConfigError, match="EXT_TEST_KEY is not set"):
        api_key_from_environment("EXT_TEST_KEY")
    monkeypatch.setenv("EXT_TEST_KEY", "sk-1")
    assert api_key_from_environment("EXT_TEST_KEY") == "sk-1"


def test_retry_after_reads_seconds_and_dates():
    assert retry_after_seconds("12") == 12.0 and retry_after_seconds(" 0 ") == 0.0
    assert retry_after_seconds("-5") == 0.0
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    now = 1_800_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_after_seconds(date, now=now) == 30.0
    assert retry_after_seconds(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
