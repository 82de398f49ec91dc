"""Interactive Chat Completions on an external revision (issue 41, item 4): the request is
relayed to the revision's server by the worker's `ExternalEngine` under the same limits,
credit hold and settlement as on Boardwalk's own engine. Checked against a real
`transformers serve` serving the tiny demo model built locally, behind the fault-injecting
proxy (tests/inference/upstreams.py) where a fault is the point: a stream's pieces come as
the server streams them, under Boardwalk's id and model, with the server's usage and one
charge; a client that closes its stream closes the upstream connection; a 503 burst is
retried within the request's time limit, and one that outlasts the attempts is answered 503
and never charged; an interactive row is sent ahead of the engine's waiting batch rows.
"""

from __future__ import annotations

import contextlib
import http.client
import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from billing.models import LedgerEntry, UsageEvent
from billing.pricing import TokenPrices, token_charge
from billing.selectors import credit_for_org
from inference import runtime
from inference.engine.types import GenerationRequest, GenerationResult, SamplingParams
from inference.external.streaming import RelayedPartial
from inference.models import ModelRevision
from tests.batches import conftest as batch_fixtures
from tests.batches.test_interactive_money import _kinds
from tests.conftest import INTERACTIVE_PRICES, Tenant
from tests.inference import test_external_engine as engine_tests
from tests.inference import test_external_model_command as command_tests
from tests.inference.test_external_validation import JSON_SCHEMA, SECRET, answer
from tests.inference.test_model_command import model
from tests.inference.upstreams import FaultProxy, Served, status

# The fixtures this module shares (pytest finds them by these names).
served = engine_tests.served
tokenizer = engine_tests.tokenizer
proxy = engine_tests.proxy
engine_of = engine_tests.engine_of
tokenizer_dir = command_tests.tokenizer_dir
in_process_worker = batch_fixtures.in_process_worker
sdk = batch_fixtures.sdk
short_linger = batch_fixtures.short_linger
body, wait_for = engine_tests.body, engine_tests.wait_for
BATCH_PRICES, external = command_tests.BATCH_PRICES, command_tests.external

MESSAGES = [{"role": "user", "content": "Say hello."}]
INTERACTIVE = tuple(
    item
    for flag, price in zip(("input", "cached-input", "output"), INTERACTIVE_PRICES, strict=True)
    for item in (f"--interactive-{flag}", str(price))
)


class StreamingProxy(FaultProxy):
    """The fault proxy, relaying a streamed answer event by event as the server sends it
    (the plain proxy reads an answer whole); with `pace`, one event every `pace` seconds
    after the first three, so a stream is still under way when its client goes. A relay
    whose client closed the connection (a write fails) is noted in `closed_by_client`, and
    the server's connection closed in turn."""

    def __init__(self, upstream: str, *, pace: float = 0.0, without_usage: bool = False) -> None:
        super().__init__(upstream, without_usage=without_usage)
        self.pace = pace

    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        if not (body and json.loads(body).get("stream")):
            super()._forward(handler, body)
            return
        assert self.upstream is not None
        connection = http.client.HTTPConnection(
            self.upstream.hostname or "127.0.0.1", self.upstream.port, timeout=120
        )
        try:
            connection.request("POST", handler.path, body=body, headers=_JSON)
            response = connection.getresponse()
            handler.send_response(response.status)
            handler.send_header("content-type", response.getheader("content-type") or "")
            handler.send_header("connection", "close")
            handler.end_headers()
            handler.close_connection = True
            events = 0
            while line := response.readline():
                if self.without_usage and line.startswith(b"data: {"):
                    event = json.loads(line[6:])
                    event.pop("usage", None)
                    line = b"data: " + json.dumps(event).encode() + b"\n"
                try:
                    handler.wfile.write(line)
                    handler.wfile.flush()
                except OSError:
                    with self._lock:
                        self.closed_by_client.append(self.seen[-1])
                    return
                if line.strip():
                    events += 1
                    if self.pace and events > 3:
                        self._closing.wait(self.pace)
        finally:
            connection.close()  # the server sees its client go


_JSON = {"content-type": "application/json"}


def _external_model(served: Served, tokenizer_dir: Path, url: str) -> ModelRevision:
    added = model(
        "add", "acme/external", *external(served, tokenizer_dir, url=url),
        *BATCH_PRICES, *INTERACTIVE,
    )  # fmt: skip
    return ModelRevision.objects.get(id=added["revision"]["id"])


@contextlib.contextmanager
def _engine_dropped(revision: ModelRevision) -> Iterator[None]:
    try:
        yield
    finally:
        runtime.engine_drop(revision.id)  # its loop thread and connections end with the test


def _ask(sdk: Any, *, stream: bool = False, **fields: Any) -> Any:
    """A request to the external model: its completion, or a stream's chunks."""
    options: dict[str, Any] = {"messages": MESSAGES, **fields}
    if stream:
        options |= {"stream": True, "stream_options": {"include_usage": True}}
    answer = sdk.chat.completions.create(model="acme/external", **options)
    return list(answer) if stream else answer


def _only_request(tenant: Tenant) -> str:
    (request_id,) = set(
        LedgerEntry.objects.filter(org=tenant.org)
        .exclude(request_id="")
        .values_list("request_id", flat=True)
    )
    return request_id


def _charged_as_used(tenant: Tenant, usage: Any) -> None:
    """One charge, of what the answer's usage says at the interactive prices, and the usage
    events say the same."""
    request_id = _only_request(tenant)
    expected = token_charge(
        TokenPrices(*INTERACTIVE_PRICES),
        prompt=usage.prompt_tokens,
        cached=0,
        completion=usage.completion_tokens,
    )
    assert _kinds(request_id)["charge"] == [expected]
    events = {e.kind: e.quantity for e in UsageEvent.objects.filter(request_id=request_id)}
    assert events["input_tokens"] == usage.prompt_tokens
    assert events["output_tokens"] == usage.completion_tokens
    assert credit_for_org(org_id=tenant.org.id).held == 0


DB = pytest.mark.django_db(transaction=True)


@DB
@pytest.mark.usefixtures("short_linger")
def test_an_answer_comes_from_the_server_under_boardwalks_names_charged_once(
    served, tokenizer_dir, sdk, tenant, in_process_worker
):
    revision = _external_model(served, tokenizer_dir, served.url)
    with _engine_dropped(revision):
        completion = _ask(sdk, max_completion_tokens=6, seed=1)
    assert completion.id.startswith("chatcmpl-") and completion.model == "acme/external"
    assert completion.system_fingerprint == revision.id
    assert completion.service_tier == "default"
    (choice,) = completion.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 6
    _charged_as_used(tenant, usage)


@DB
@pytest.mark.usefixtures("short_linger")
def test_a_stream_relays_the_servers_pieces_as_they_come_with_its_usage(
    served, tokenizer_dir, sdk, tenant, in_process_worker
):
    with StreamingProxy(served.url.removesuffix("/v1")) as upstream:
        revision = _external_model(served, tokenizer_dir, upstream.url)
        with _engine_dropped(revision):
            chunks = _ask(sdk, stream=True, max_completion_tokens=8, seed=2)
        (sent,) = upstream.posts()
    # Upstream: a stream, with the engine's model id and the usage asked for.
    assert sent["json"]["stream"] is True and sent["json"]["model"] == served.model
    assert sent["json"]["stream_options"] == {"include_usage": True}
    # Downstream: Boardwalk's id and model on every chunk, the text in pieces, a finish
    # reason, then the usage alone.
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].id.startswith("chatcmpl-")
    assert {c.model for c in chunks} == {"acme/external"}
    assert {c.system_fingerprint for c in chunks} == {revision.id}
    pieces = [c.choices[0].delta.content for c in chunks[1:] if c.choices]
    texts = [p for p in pieces if p]
    assert len(texts) >= 2, "the text came in one piece: nothing was streamed"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and not any(finishes[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert 0 < last.usage.completion_tokens <= 8 and last.usage.prompt_tokens > 0
    _charged_as_used(tenant, last.usage)


@DB
@pytest.mark.usefixtures("short_linger")
def test_a_client_that_closes_its_stream_closes_the_upstream_connection(
    served, tokenizer_dir, live_server, tenant, in_process_worker
):
    # The proxy relays the server's stream slowly: it is under way when the client goes.
    with StreamingProxy(served.url.removesuffix("/v1"), pace=0.2) as upstream:
        revision = _external_model(served, tokenizer_dir, upstream.url)
        with _engine_dropped(revision), httpx2.Client(timeout=120) as client:
            request = {
                "model": "acme/external",
                "messages": MESSAGES,
                "max_completion_tokens": 200,
                "stream": True,
            }
            headers = {"authorization": f"Bearer {tenant.write_key}"}
            url = f"{live_server.url}/v1/chat/completions"
            with client.stream("POST", url, json=request, headers=headers) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line.startswith("data:") and '"content":"' in line.replace(" ", ""):
                        payload = json.loads(line[5:])
                        if payload["choices"][0]["delta"].get("content"):
                            break  # the first piece of text: the client goes away
            wait_for(lambda: len(upstream.closed_by_client) == 1)
            request_id = _only_request(tenant)
            wait_for(lambda: "charge" in _kinds(request_id))
    # It pays its prompt and the text that came before it went away, once.
    (charge,) = _kinds(request_id)["charge"]
    events = {e.kind: e.quantity for e in UsageEvent.objects.filter(request_id=request_id)}
    assert events["input_tokens"] > 0 and events["output_tokens"] > 0
    assert charge == token_charge(
        TokenPrices(*INTERACTIVE_PRICES),
        prompt=events["input_tokens"],
        cached=0,
        completion=events["output_tokens"],
    )
    assert credit_for_org(org_id=tenant.org.id).held == 0


@DB
@pytest.mark.usefixtures("short_linger")
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_503_burst_is_retried_within_the_requests_time_limit(
    served, tokenizer_dir, sdk, tenant, in_process_worker, stream
):
    with FaultProxy(served.url.removesuffix("/v1")) as upstream:
        upstream.plan(status(503, retry_after="0"), status(503, retry_after="0"))
        revision = _external_model(served, tokenizer_dir, upstream.url)
        with _engine_dropped(revision):
            answer = _ask(sdk, stream=stream, max_completion_tokens=4)
            usage = answer[-1].usage if stream else answer.usage
        assert [s["answer"] for s in upstream.posts()] == ["status", "status", "forward"]
    assert usage is not None and usage.completion_tokens > 0
    _charged_as_used(tenant, usage)


def _refused_uncharged(
    served: Served, tokenizer_dir: Path, sdk: Any, tenant: Tenant, plan: list, **ask: Any
) -> tuple[openai.APIStatusError, int]:
    """Ask once through a proxy answering `plan`: the error the client got and the posts
    the server saw, after checking the request was settled with no charge."""
    before = credit_for_org(org_id=tenant.org.id)
    with FaultProxy(served.url.removesuffix("/v1")) as upstream:
        upstream.plan(*plan)
        revision = _external_model(served, tokenizer_dir, upstream.url)
        with _engine_dropped(revision), pytest.raises(openai.APIStatusError) as caught:
            _ask(sdk, max_completion_tokens=4, **ask)
        posts = len(upstream.posts())
    request_id = _only_request(tenant)
    wait_for(lambda: credit_for_org(org_id=tenant.org.id).held == 0)
    assert sum(_kinds(request_id).get("charge", [])) == 0
    assert credit_for_org(org_id=tenant.org.id).balance == before.balance
    return caught.value, posts


@DB
@pytest.mark.usefixtures("short_linger")
def test_a_503_storm_past_the_attempts_is_answered_with_an_error_and_never_charged(
    served, tokenizer_dir, sdk, tenant, in_process_worker
):
    error, posts = _refused_uncharged(
        served, tokenizer_dir, sdk, tenant, [status(503, retry_after="0")] * 3
    )
    assert posts == 3
    # The fleet was overloaded, not the request at fault: 503, which the SDK retries.
    assert error.status_code == 503
    assert error.body["code"] == "service_unavailable"


# -- the engine: interactive rows ahead of batch rows ------------------------------------------


def _row(seed: int, *, priority: int = 0, stream: bool = False) -> GenerationRequest:
    return GenerationRequest(
        id=f"row-{seed}",
        prompt_ids=[1, 2, 3],
        params=SamplingParams(max_new_tokens=3, temperature=0.0),
        body=body(seed),
        priority=priority,
        stream=stream,
    )


def test_an_interactive_row_is_sent_ahead_of_the_engines_waiting_batch_rows(proxy, engine_of):
    proxy.delay = 0.2  # each answer takes a while: the rows behind the first wait for its slot
    engine = engine_of(proxy, max_in_flight=1)
    for seed in (1, 2, 3):
        engine.add(_row(seed))
    wait_for(lambda: proxy.in_flight == 1)  # row 1 holds the one slot; 2 and 3 wait
    engine.add(_row(9, priority=1))
    results = _results(engine, 4)
    assert all(r.error is None for r in results.values())
    order = [s["json"]["seed"] for s in proxy.posts()]
    assert order[:2] == [1, 9] and sorted(order[2:]) == [2, 3]
    assert proxy.max_in_flight == 1  # the interactive row kept the revision's limit


def test_a_streamed_row_comes_out_of_step_in_pieces_then_whole(served, engine_of):
    with StreamingProxy(served.url.removesuffix("/v1")) as upstream:
        engine = engine_of(upstream)
        request = _row(4, priority=1, stream=True)
        request.body = body(4, max_tokens=8)
        engine.add(request)
        outputs = _outputs(engine, 1)
    partials = [o for o in outputs if isinstance(o, RelayedPartial)]
    (result,) = [o for o in outputs if isinstance(o, GenerationResult)]
    assert outputs[-1] is result and len(partials) >= 2
    assert result.error is None and result.response is not None
    (choice,) = result.choices
    assert choice.text == "".join(p.text for p in partials)
    assert result.response["usage"]["completion_tokens"] == result.completion_tokens > 0


def _outputs(engine: Any, count: int) -> list[Any]:
    """Every output until `count` results came."""
    outputs: list[Any] = []
    finished = 0

    def more() -> bool:
        nonlocal finished
        for output in engine.step(wait=0.2):
            outputs.append(output)
            finished += isinstance(output, GenerationResult)
        return finished >= count

    wait_for(more)
    return outputs


def _results(engine: Any, count: int) -> dict[str, GenerationResult]:
    return {o.id: o for o in _outputs(engine, count) if isinstance(o, GenerationResult)}


def test_a_stream_without_usage_is_counted_with_the_tokenizer(served, engine_of, tokenizer):
    with StreamingProxy(served.url.removesuffix("/v1"), without_usage=True) as upstream:
        engine = engine_of(upstream)
        request = _row(5, priority=1, stream=True)
        request.body = body(5, max_tokens=8)
        engine.add(request)
        (result,) = [o for o in _outputs(engine, 1) if isinstance(o, GenerationResult)]
    assert result.error is None and result.response is not None
    assert "usage" not in result.response
    (choice,) = result.choices
    assert result.prompt_tokens == len(request.prompt_ids)
    assert result.completion_tokens == len(tokenizer.encode(choice.text, add_special_tokens=False))


@DB
@pytest.mark.usefixtures("short_linger")
def test_an_answer_that_breaks_the_requests_schema_is_an_error_never_charged(
    served, tokenizer_dir, sdk, tenant, in_process_worker
):
    # The server ignores response_format (as one without structured outputs does).
    canned = status(200, body=answer(f"It is sunny, {SECRET}."))
    error, posts = _refused_uncharged(
        served, tokenizer_dir, sdk, tenant, [canned], response_format=JSON_SCHEMA
    )
    assert posts == 1  # not retried: the server did answer
    assert error.status_code == 500
    assert error.body["code"] == "invalid_model_output"
    assert SECRET not in json.dumps(error.body)
