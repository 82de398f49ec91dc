"""The external engine (issue 41, second slice): `ExternalEngine` is a `GenerationEngine` whose
rows a real `transformers serve` answers, serving the tiny demo model built locally, behind the
fault-injecting proxy (tests/inference/upstreams.py). Driven by its verbs as the worker's run
drives an engine: rows added come back as results with text and usage; a 429/503 burst and a
cut connection are retried, each row finishing once; a row past its deadline is never sent;
an abort closes the row's connection; a server that reports no usage is counted with the
revision's tokenizer.
"""

from __future__ import annotations

import asyncio
import pickle
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from boardwalk.codes import ItemCode
from inference.engine.types import GenerationRequest, GenerationResult, SamplingParams
from inference.external.backoff import Backoff
from inference.external.client import Final
from inference.external.engine import ExternalEngine, final_code
from inference.external.limits import LocalInFlightLimit, Signal
from inference.external.upstream import Upstream
from inference.rendering import render_prompt
from tests.conftest import redis_only
from tests.inference.upstreams import (
    FaultProxy,
    Served,
    cut,
    cut_body,
    free_port,
    hold,
    serve,
    status,
)

FAST = Backoff(base_seconds=0.01, cap_seconds=0.05)
WAIT_SECONDS = 120  # a bound on waiting for results, so a broken engine fails the test


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(tiny_model_dir, tmp_path_factory.mktemp("serve")) as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture
def proxy(served: Served) -> Iterator[FaultProxy]:
    with FaultProxy(served.url.removesuffix("/v1")) as running:
        yield running


@pytest.fixture
def engine_of(served: Served, tokenizer: Any) -> Iterator[Callable[..., ExternalEngine]]:
    """Engines on the served model through a proxy, closed at the end of the test."""
    made: list[ExternalEngine] = []

    def make(proxy: FaultProxy, **options: Any) -> ExternalEngine:
        upstream = Upstream(url=proxy.url, model=served.model, request_timeout=60.0)
        defaults: dict[str, Any] = {
            "max_in_flight": 4,
            "revision_id": "mcfg_test",
            "backoff": FAST,
        }
        engine = ExternalEngine(upstream, tokenizer, **(defaults | options))
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


def body(seed: int, **fields: Any) -> dict[str, Any]:
    """A row's body; its seed tells the proxy's requests apart."""
    return {
        "model": "acme/big",
        "messages": [{"role": "user", "content": f"Say hello, number {seed}."}],
        "max_tokens": 3,
        "temperature": 0,
        "seed": seed,
    } | fields


def row(
    seed: int,
    *,
    deadline: float | None = None,
    prompt_ids: list[int] | None = None,
    priority: int = 0,
) -> Any:
    return GenerationRequest(
        id=f"row-{seed}",
        prompt_ids=prompt_ids or [],
        params=SamplingParams(max_new_tokens=3, temperature=0.0),
        body=body(seed),
        deadline=deadline,
        priority=priority,
    )


def results_of(engine: ExternalEngine, count: int) -> dict[str, GenerationResult]:
    """Step until `count` results came, each once."""
    results: dict[str, GenerationResult] = {}
    give_up = time.monotonic() + WAIT_SECONDS
    while len(results) < count:
        assert time.monotonic() < give_up, f"{len(results)} of {count} results came"
        for output in engine.step(wait=0.5):
            assert isinstance(output, GenerationResult)
            assert output.id not in results, f"{output.id} finished twice"
            results[output.id] = output
    assert not engine.has_unfinished and not engine.broken
    return results


def wait_for(condition: Callable[[], bool]) -> None:
    give_up = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < give_up, "the condition never held"
        time.sleep(0.02)


def seeds(requests: list[dict[str, Any]], answer: str | None = None) -> list[int]:
    return sorted(
        s["json"]["seed"] for s in requests if answer is None or s.get("answer") == answer
    )


# -- plain data -----------------------------------------------------------------------------


def test_the_new_fields_are_plain_data_that_cross_a_pipe():
    request = row(1, deadline=1_800_000_000.0)
    again = pickle.loads(pickle.dumps(request))  # noqa: S301 (our own object)
    assert again == request and again.body == body(1) and again.deadline == 1_800_000_000.0
    plain = GenerationRequest(id="r", prompt_ids=[1], params=SamplingParams(max_new_tokens=1))
    assert plain.body is None and plain.deadline is None
    result = GenerationResult("r", [], 1, 0, 0, 0.0, response={"id": "chatcmpl-1"})
    assert pickle.loads(pickle.dumps(result)).response == {"id": "chatcmpl-1"}  # noqa: S301


def test_final_answers_map_to_the_rows_codes():
    context = "This model's maximum context length is 2048 tokens."
    assert final_code(Final(400, None, context)) is ItemCode.CONTEXT_LENGTH_EXCEEDED
    assert final_code(Final(400, "context_length_exceeded")) is ItemCode.CONTEXT_LENGTH_EXCEEDED
    assert final_code(Final(400, "invalid_value", "bad top_p")) is ItemCode.INVALID_REQUEST
    assert final_code(Final(422, None, "field required")) is ItemCode.INVALID_REQUEST
    for refused in (401, 403, 404):
        assert final_code(Final(refused)) is ItemCode.INTERNAL_ERROR


# -- against the server ---------------------------------------------------------------------


def test_rows_added_come_back_with_text_and_usage(proxy, engine_of, tokenizer):
    engine = engine_of(proxy)
    assert engine.credit == 8 and engine.max_batch_size == 4
    assert engine.contains_failures and engine.media_modalities == frozenset()
    assert engine.tokenizer is tokenizer
    for seed in range(8):
        engine.add(row(seed))
    assert engine.has_unfinished
    results = results_of(engine, 8)
    assert sorted(results) == [f"row-{seed}" for seed in range(8)]
    for result in results.values():
        assert result.error is None and not result.aborted
        [choice] = result.choices
        assert choice.text and choice.token_ids == [] and choice.finish_reason
        assert choice.text == result.response["choices"][0]["message"]["content"]
        usage = result.response["usage"]
        assert (result.prompt_tokens, result.completion_tokens) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )
        assert result.completion_tokens >= 1 and result.busy_seconds > 0
        assert result.params is not None and result.params.max_new_tokens == 3
    # Every row sent once, with the engine's model id, never more than the limit at once.
    assert seeds(proxy.posts()) == list(range(8))
    assert {s["json"]["model"] for s in proxy.posts()} == {engine.upstream.model}
    assert proxy.max_in_flight <= 4


def test_a_429_and_503_burst_is_ridden_out_each_row_finishing_once(proxy, engine_of):
    proxy.plan(
        *[status(429, retry_after="0") for _ in range(4)],
        *[status(503, retry_after="1") for _ in range(2)],
    )
    engine = engine_of(proxy, max_attempts=8)
    for seed in range(6):
        engine.add(row(seed))
    results = results_of(engine, 6)
    assert all(r.error is None and r.choices[0].text for r in results.values())
    answers = [s["answer"] for s in proxy.posts()]
    assert answers.count("status") == 6  # the whole burst was answered…
    # …and every row reached the server exactly once.
    assert seeds(proxy.posts(), "forward") == list(range(6))


def test_cut_connections_are_retried(proxy, engine_of):
    proxy.plan(cut(), cut_body())
    engine = engine_of(proxy, max_in_flight=1)
    engine.add(row(1))
    [result] = results_of(engine, 1).values()
    assert result.error is None and result.choices[0].text
    assert [s["answer"] for s in proxy.posts()] == ["cut", "cut_body", "forward"]


def test_retries_stop_at_the_rows_attempts(proxy, engine_of):
    # Answers that ran at the server (a 502, a connection cut after it was made) spend a
    # batch row's attempts; an interactive row spends one on every retry, 503 included.
    proxy.plan(status(502), cut(), status(502), *[status(503, retry_after="0")] * 3)
    engine = engine_of(proxy, max_attempts=3)
    engine.add(row(1))
    [result] = results_of(engine, 1).values()
    assert result.error == ItemCode.UPSTREAM_UNAVAILABLE and result.choices == []
    assert len(proxy.posts()) == 3
    engine.add(row(2, priority=1))
    [result] = results_of(engine, 1).values()
    assert result.error == ItemCode.UPSTREAM_UNAVAILABLE
    assert len(proxy.posts()) == 6


def test_a_batch_row_waits_out_a_storm_longer_than_its_attempts(proxy, engine_of):
    """429s and 503s say the server took nothing: a batch row's retries of them are not its
    attempts, so it finishes when the storm ends."""
    storm = [status(503, retry_after="0"), status(429, retry_after="0")] * 3
    proxy.plan(*storm)
    engine = engine_of(proxy, max_attempts=2)
    engine.add(row(1))
    [result] = results_of(engine, 1).values()
    assert result.error is None and result.choices[0].text
    assert len(proxy.posts()) == len(storm) + 1


def test_a_batch_row_never_reaching_the_server_waits_until_its_deadline(tokenizer):
    """No connection can be made (the server is down): nothing was sent, so the row tries
    again until its deadline and ends as the batch's expiry says, not as spent attempts."""
    upstream = Upstream(url=f"http://127.0.0.1:{free_port()}/v1", model="m", connect_timeout=1)
    engine = ExternalEngine(
        upstream, tokenizer, max_in_flight=2, revision_id="mcfg_test", backoff=FAST,
        max_attempts=1,
    )  # fmt: skip
    try:
        engine.add(row(1, deadline=time.time() + 3))
        engine.add(row(2, priority=1))
        results = results_of(engine, 2)
    finally:
        engine.close()
    assert results["row-1"].error == ItemCode.BATCH_EXPIRED
    assert results["row-2"].error == ItemCode.UPSTREAM_UNAVAILABLE


def test_a_final_answer_ends_the_row_with_its_code(proxy, engine_of):
    proxy.plan(status(400, body={"error": {"message": "bad top_p", "code": "invalid_value"}}))
    engine = engine_of(proxy)
    engine.add(row(1))
    [result] = results_of(engine, 1).values()
    assert result.error == ItemCode.INVALID_REQUEST and len(proxy.posts()) == 1


def test_a_row_past_its_deadline_is_never_sent(proxy, engine_of):
    engine = engine_of(proxy)
    engine.add(row(1, deadline=time.time() - 1, prompt_ids=[5, 6, 7]))
    engine.add(row(2, deadline=time.time() + 600))
    results = results_of(engine, 2)
    late = results["row-1"]
    assert late.error == ItemCode.BATCH_EXPIRED and late.choices == [] and not late.aborted
    assert late.prompt_tokens == 3 and late.completion_tokens == 0
    assert results["row-2"].error is None
    assert seeds(proxy.posts()) == [2]  # the proxy never saw the late row


def test_a_retry_that_would_land_past_the_deadline_is_not_made(proxy, engine_of):
    proxy.plan(status(429, retry_after="30"))
    engine = engine_of(proxy)
    engine.add(row(1, deadline=time.time() + 5))
    [result] = results_of(engine, 1).values()
    assert result.error == ItemCode.BATCH_EXPIRED and len(proxy.posts()) == 1


def test_an_abort_closes_the_rows_connection(proxy, engine_of):
    proxy.plan(hold())
    engine = engine_of(proxy)
    engine.add(row(1))
    wait_for(lambda: proxy.in_flight == 1)  # the request is at the upstream
    engine.abort(["row-1", "never-added"])
    [result] = results_of(engine, 1).values()
    assert result.aborted and result.error is None and result.choices == []
    wait_for(lambda: len(proxy.closed_by_client) == 1)
    assert seeds(proxy.closed_by_client) == [1]
    # The engine goes on: the next row is answered.
    engine.add(row(2))
    assert results_of(engine, 1)["row-2"].error is None


def test_usage_missing_is_counted_with_the_tokenizer(served, engine_of, tokenizer):
    with FaultProxy(served.url.removesuffix("/v1"), without_usage=True) as bare:
        engine = engine_of(bare)
        engine.add(row(1))
        rendered = render_prompt(tokenizer, body(2)["messages"])
        engine.add(row(2, prompt_ids=rendered))
        results = results_of(engine, 2)
    for seed in (1, 2):
        result = results[f"row-{seed}"]
        assert "usage" not in result.response
        text = result.choices[0].text
        assert result.completion_tokens == len(tokenizer.encode(text, add_special_tokens=False))
        assert result.prompt_tokens == len(render_prompt(tokenizer, body(seed)["messages"]))
        assert result.completion_tokens >= 1 and result.cached_tokens == 0


def test_generate_is_a_loop_over_the_verbs(proxy, engine_of):
    engine = engine_of(proxy, max_in_flight=2)
    results = list(engine.generate(row(seed) for seed in range(5)))
    assert sorted(r.id for r in results) == [f"row-{seed}" for seed in range(5)]
    assert all(isinstance(r, GenerationResult) and r.error is None for r in results)
    assert not engine.has_unfinished


@redis_only
def test_the_in_flight_limit_is_held_in_redis_when_configured(proxy, engine_of):
    import redis

    revision = f"mcfg_test_{uuid.uuid4().hex}"
    prefix = "boardwalk-test:external"
    engine = engine_of(
        proxy,
        max_in_flight=3,
        revision_id=revision,
        redis_url=django_settings.REDIS_URL,
        redis_prefix=prefix,
    )
    for seed in range(6):
        engine.add(row(seed))
    assert all(r.error is None for r in results_of(engine, 6).values())
    assert proxy.max_in_flight <= 3
    sync = redis.Redis.from_url(django_settings.REDIS_URL)
    try:
        state = sync.hgetall(f"{prefix}:{revision}:state")
        assert int(state[b"limit"]) == 3  # grown back to its cap by the successes
        assert sync.zcard(f"{prefix}:{revision}:slots") == 0  # every slot given back
    finally:
        sync.delete(f"{prefix}:{revision}:slots", f"{prefix}:{revision}:state")
        sync.close()


def test_a_generate_call_abandoned_aborts_what_it_left(proxy, engine_of):
    proxy.plan(hold())
    engine = engine_of(proxy, max_in_flight=2)
    calls = engine.generate([row(1), row(2), row(3)])
    first = next(calls)  # one row is held at the upstream; another is answered
    wait_for(lambda: len(seeds(proxy.posts(), "hold")) == 1)
    [held] = seeds(proxy.posts(), "hold")
    assert isinstance(first, GenerationResult) and first.id != f"row-{held}"
    calls.close()  # the caller stops mid-run
    wait_for(lambda: seeds(proxy.closed_by_client) == [held])  # its connection closed
    wait_for(lambda: not engine.has_unfinished)
    assert engine.step() == []  # the abandoned rows' results are dropped, not handed on


def test_a_row_with_no_body_is_refused_without_a_request(proxy, engine_of):
    engine = engine_of(proxy)
    engine.add(GenerationRequest(id="bare", prompt_ids=[1, 2], params=SamplingParams(3)))
    [result] = results_of(engine, 1).values()
    assert result.error == ItemCode.INVALID_REQUEST and result.prompt_tokens == 2
    assert proxy.seen == []


def test_the_engine_is_broken_only_when_its_loop_dies(proxy, engine_of):
    engine = engine_of(proxy, max_in_flight=1)
    proxy.plan(hold())
    engine.add(row(1))
    wait_for(lambda: proxy.in_flight == 1)
    assert not engine.broken
    engine._loop.call_soon_threadsafe(engine._loop.stop)  # the loop's thread ends abruptly
    wait_for(lambda: engine.broken)
    assert engine.step(wait=0.1) == []  # what was held is the caller's to hand back
    wait_for(lambda: seeds(proxy.closed_by_client) == [1])  # and its connection closed
    assert not engine.has_unfinished
    engine.add(row(2))  # taken, never answered
    assert not engine.has_unfinished


def test_rows_at_the_server_together_share_its_gpu_time_once():
    """A private deployment pays its declared GPUs x the time at least one of its rows is in
    flight, overlap counted once: each row's busy time is its share of that (the in-flight
    limit's busy clock, inference/external/limits.py)."""
    now = [100.0]
    limit = LocalInFlightLimit(cap=4, clock=lambda: now[0])

    async def go() -> tuple[float, float, float]:
        a = await limit.try_acquire()
        now[0] += 1.0  # a alone for a second
        b = await limit.try_acquire()
        now[0] += 2.0  # both for two
        a_end = await limit.release(a, Signal.SUCCESS)
        now[0] += 1.0  # b alone for one
        b_end = await limit.release(b, Signal.SUCCESS)
        now[0] += 5.0  # nothing in flight: nobody pays
        c = await limit.try_acquire()
        c_end = await limit.release(c, Signal.SUCCESS)
        return a_end - a.busy_mark, b_end - b.busy_mark, c_end - c.busy_mark

    a, b, c = asyncio.run(go())
    assert a == 1.0 + 2.0 / 2
    assert b == 2.0 / 2 + 1.0
    assert c == 0.0
    assert a + b == 4.0  # the 4 s during which a row was in flight
