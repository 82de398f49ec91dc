"""The official OpenAI SDK drives POST /v1/chat/completions on the embedded default: the
request runs on the in-process worker's engine, plain, streamed, structured and with tools."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import httpx2
import openai
import pytest
from django.test import Client
from openai import OpenAI

from billing.models import LedgerEntry, UsageEvent
from billing.pricing import TokenPrices, token_charge
from billing.selectors import credit_for_org
from boardwalk.channels import channels
from boardwalk.metrics import labels_text
from boardwalk.services import api_key_create
from inference import runtime
from inference.demo.fake_engine import WORD, FakeEngine
from tests.batches.test_interactive_metrics import samples
from tests.batches.test_openai_sdk import ANSWER_FORMAT, LOOKUP_TOOL
from tests.conftest import Tenant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("short_linger")]

INTERACTIVE_PRICES = (300_000, 150_000, 1_200_000)
MESSAGES = [{"role": "user", "content": "Hello there"}]


@pytest.fixture
def priced(catalog_model):
    (
        catalog_model.price_input_interactive,
        catalog_model.price_cached_input_interactive,
        catalog_model.price_output_interactive,
    ) = INTERACTIVE_PRICES
    catalog_model.save()
    return catalog_model


@pytest.fixture
def client(sdk: OpenAI) -> OpenAI:
    return sdk


def _charged(tenant: Tenant) -> int:
    return sum(
        e.amount_microusd
        for e in LedgerEntry.objects.filter(org=tenant.org, kind=LedgerEntry.Kind.CHARGE)
    )


def test_plain_completion_is_answered_metered_and_charged(
    client, priced, tenant, in_process_worker
):
    before = credit_for_org(org_id=tenant.org.id)
    completion = client.chat.completions.create(
        model="boardwalk/tiny-chat", messages=MESSAGES, max_completion_tokens=8, seed=1
    )
    assert completion.object == "chat.completion"
    assert completion.service_tier == "default"
    assert completion.choices[0].message.role == "assistant"
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 8
    events = {
        e.kind: e.quantity
        for e in UsageEvent.objects.filter(org=tenant.org, usage_class="interactive")
    }
    assert events["input_tokens"] == usage.prompt_tokens
    assert events["output_tokens"] == usage.completion_tokens
    expected = (
        usage.prompt_tokens * INTERACTIVE_PRICES[0]
        + usage.completion_tokens * INTERACTIVE_PRICES[2]
        + 500_000
    ) // 1_000_000
    assert _charged(tenant) == expected
    after = credit_for_org(org_id=tenant.org.id)
    assert after.held == before.held  # the hold was released
    assert after.balance == before.balance - expected


def test_streamed_completion_matches_the_plain_one(client, priced, in_process_worker):
    plain = client.chat.completions.create(
        model="boardwalk/tiny-chat", messages=MESSAGES, max_completion_tokens=8, temperature=0
    )
    stream = client.chat.completions.create(
        model="boardwalk/tiny-chat",
        messages=MESSAGES,
        max_completion_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == plain.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_structured_output_and_tools(client, priced, in_process_worker):
    answer = client.chat.completions.create(
        model="boardwalk/tiny-chat",
        messages=MESSAGES,
        max_completion_tokens=40,
        response_format=ANSWER_FORMAT,
        seed=1,
    )
    assert json.loads(answer.choices[0].message.content or "") in (
        {"label": "yes"},
        {"label": "no"},
    )
    called = client.chat.completions.create(
        model="boardwalk/tiny-chat",
        messages=MESSAGES,
        max_completion_tokens=60,
        tools=[LOOKUP_TOOL],
        tool_choice="required",
        seed=3,
    )
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "lookup" and set(json.loads(call.function.arguments)) == {"id"}
    streamed = client.chat.completions.create(
        model="boardwalk/tiny-chat",
        messages=MESSAGES,
        max_completion_tokens=60,
        tools=[LOOKUP_TOOL],
        tool_choice="required",
        seed=3,
        stream=True,
    )
    calls = [tc for c in streamed if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [tc.function.name for tc in calls] == ["lookup"]


def test_errors_map_to_sdk_exceptions_and_charge_nothing(client, priced, tenant, live_server):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(
            model="no-such-model", messages=MESSAGES, max_completion_tokens=8
        )
    assert missing.value.status_code == 404 and missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model="boardwalk/tiny-chat", messages=MESSAGES, max_completion_tokens=8, temperature=9
        )
    assert bad.value.status_code == 400 and bad.value.code == "invalid_request"
    assert bad.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as biased:
        client.chat.completions.create(
            model="boardwalk/tiny-chat",
            messages=MESSAGES,
            max_completion_tokens=8,
            logit_bias={"x": 5},
        )
    assert biased.value.param == "logit_bias"
    # The field as the request names it: no batch row's "body." prefix, in any case.
    assert biased.value.body["message"].startswith("Logit_bias must map token ids")
    assert "body." not in str(biased.value.body).lower()
    reader = api_key_create(org=tenant.org, scopes="requests:read").secret
    with (
        OpenAI(base_url=f"{live_server.url}/v1", api_key=reader, max_retries=0) as stranger,
        pytest.raises(openai.PermissionDeniedError) as denied,
    ):
        stranger.chat.completions.create(
            model="boardwalk/tiny-chat", messages=MESSAGES, max_completion_tokens=8
        )
    assert denied.value.status_code == 403 and denied.value.code == "insufficient_scope"
    assert not LedgerEntry.objects.filter(org=tenant.org).exclude(kind="grant").exists()
    assert not UsageEvent.objects.filter(org=tenant.org).exists()


def test_flex_without_headroom_is_429_after_the_sdk_retries(live_server, tenant, priced):
    # No worker serves the model, so no row is free: flex answers 429 with Retry-After.
    attempts = []

    def count(request):
        attempts.append(request)

    with (
        OpenAI(
            base_url=f"{live_server.url}/v1",
            api_key=tenant.write_key,
            max_retries=1,
            http_client=httpx2.Client(event_hooks={"request": [count]}),
        ) as sdk,
        pytest.raises(openai.RateLimitError) as limited,
    ):
        sdk.chat.completions.create(
            model="boardwalk/tiny-chat",
            messages=MESSAGES,
            max_completion_tokens=8,
            service_tier="flex",
        )
    assert limited.value.status_code == 429 and limited.value.code == "resource_unavailable"
    assert limited.value.response.headers["retry-after"]
    assert len(attempts) == 2  # the SDK retried once, as Retry-After told it
    assert not LedgerEntry.objects.filter(org=tenant.org).exclude(kind="grant").exists()


def test_concurrency_limit_is_429_with_ratelimit_headers(client, priced, tenant, settings):
    settings.INTERACTIVE_MAX_CONCURRENT = 0
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(
            model="boardwalk/tiny-chat", messages=MESSAGES, max_completion_tokens=8
        )
    assert limited.value.code == "rate_limit_exceeded"
    headers = limited.value.response.headers
    assert headers["x-ratelimit-limit-requests"] == "0"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert "x-ratelimit-remaining-tokens" in headers
    assert not LedgerEntry.objects.filter(org=tenant.org).exclude(kind="grant").exists()


def test_partial_text_streams_in_deltas_that_make_the_final_text(
    client, fake_engine, in_process_worker
):
    plain = client.chat.completions.create(
        model="boardwalk/tiny-chat", messages=MESSAGES, max_completion_tokens=5
    )
    stream = client.chat.completions.create(
        model="boardwalk/tiny-chat", messages=MESSAGES, max_completion_tokens=5, stream=True
    )
    deltas = [c.choices[0].delta.content for c in stream if c.choices]
    texts = [d for d in deltas if d]
    assert len(texts) == 5  # one per step, as the engine yielded them
    assert "".join(texts) == plain.choices[0].message.content == WORD * 5


def test_a_closed_stream_aborts_its_request_and_frees_its_rows(
    client, fake_engine, priced, tenant, in_process_worker
):
    before = credit_for_org(org_id=tenant.org.id)
    stream = client.chat.completions.create(
        model="boardwalk/tiny-chat", messages=MESSAGES, max_completion_tokens=400, stream=True
    )
    chunks = iter(stream)
    first = [next(chunks) for _ in range(3)]  # the role, then text as it comes
    running = "boardwalk_interactive_in_flight{" + labels_text({"revision": priced.revision_id})
    deadline = time.monotonic() + 30
    while samples(Client()).get(running + "}") != 1 and time.monotonic() < deadline:
        time.sleep(0.1)  # the worker reports what it runs twice a second
    assert samples(Client())[running + "}"] == 1
    stream.close()  # the client goes away mid-answer
    generation_id = "ia:req_" + first[0].id.removeprefix("chatcmpl-")
    while generation_id not in fake_engine.freed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert generation_id in fake_engine.told  # the engine was given its id in aborted()
    assert fake_engine.freed == [generation_id]  # and freed its rows before its 400 tokens
    request_id = generation_id.removeprefix("ia:")
    settled = LedgerEntry.objects.filter(request_id=request_id)
    while not settled.filter(kind="release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    # A cut stream pays its prompt and the tokens generated before it stopped, as OpenAI
    # bills a cancelled stream: more than the 2 text chunks it received, far fewer than 400.
    usage = {e.kind: e.quantity for e in UsageEvent.objects.filter(request_id=request_id)}
    assert 2 <= usage["output_tokens"] < 400
    expected = token_charge(
        TokenPrices(*INTERACTIVE_PRICES),
        prompt=usage["input_tokens"],
        cached=0,
        completion=usage["output_tokens"],
    )
    assert [e.amount_microusd for e in settled.filter(kind="charge")] == [expected]
    after = credit_for_org(org_id=tenant.org.id)
    assert (after.balance, after.held) == (before.balance - expected, before.held)


class AddRecordingFake(FakeEngine):
    """The fake engine, recording how many batch rows it held when an interactive request
    was added to it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batch_rows_at_interactive: list[int] = []

    def batch_rows(self) -> int:
        with self._lock:
            return sum(1 for r in self._rows.values() if r[0].priority <= 0)

    def add(self, request: Any) -> None:
        if request.priority > 0:
            self.batch_rows_at_interactive.append(self.batch_rows())
        super().add(request)


def test_an_interactive_request_behind_a_full_engine_reaches_it_at_once(
    client, priced, api, in_process_worker
):
    from tests.batches.conftest import rows, submit

    revision = priced.revision
    real = runtime.engine_for(revision)
    fake = AddRecordingFake(
        real.tokenizer,
        context_length=revision.context_length,
        max_batch_size=1,  # one batch row fills it
        step_seconds=0.02,
        abort_poll_seconds=0.02,
    )
    runtime._engines[revision.id] = fake
    try:
        submit(api, rows(1, max_tokens=60))
        deadline = time.monotonic() + 60
        while fake.batch_rows() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fake.batch_rows() == 1  # the batch row holds the engine's only row
        client.chat.completions.create(
            model="boardwalk/tiny-chat", messages=MESSAGES, max_completion_tokens=2
        )
    finally:
        runtime._engines[revision.id] = real
    # Added while the batch row was in flight, not queued behind it: the engine's scheduler
    # gives it the row first (a real engine parks the batch sequence).
    assert fake.batch_rows_at_interactive == [1]


CONTENT_MARKER = "PLAINTEXT-MARKER-do-not-send"


def test_no_content_crosses_the_channels_in_the_clear(
    client, priced, in_process_worker, monkeypatch
):
    store = channels()
    sent: list[bytes] = []
    push = store.push

    def recording(key: str, message: bytes, *, ttl: float) -> None:
        sent.append(message)
        push(key, message, ttl=ttl)

    monkeypatch.setattr(store, "push", recording)
    completion = client.chat.completions.create(
        model="boardwalk/tiny-chat",
        messages=[{"role": "user", "content": CONTENT_MARKER}],
        max_completion_tokens=8,
        temperature=0,
    )
    text = completion.choices[0].message.content or ""
    assert len(sent) >= 3  # the request, "taken", the result
    for message in sent:
        assert CONTENT_MARKER.encode() not in message
        if len(text) >= 4:
            assert text.encode() not in message


def test_a_tampered_request_message_is_refused_and_the_genuine_one_answered(
    client, priced, tenant, in_process_worker, monkeypatch, caplog
):
    """A message on the request channel whose ciphertext was altered (or that no web process
    with our master keys sealed) opens to nothing: the feed logs the refusal without its
    content and goes on, and the genuine request behind it is answered and charged once."""
    store = channels()
    push = store.push
    tampered: list[bytes] = []

    def tampering(key: str, message: bytes, *, ttl: float) -> None:
        if key.startswith("interactive:requests:") and not tampered:
            envelope = json.loads(message)
            sealed = bytearray(base64.b64decode(envelope["sealed"]))
            sealed[-1] ^= 0x01  # one bit of the authentication tag
            envelope["sealed"] = base64.b64encode(bytes(sealed)).decode()
            tampered.append(json.dumps(envelope).encode())
            push(key, tampered[0], ttl=ttl)  # ahead of the genuine one
        push(key, message, ttl=ttl)

    monkeypatch.setattr(store, "push", tampering)
    before = credit_for_org(org_id=tenant.org.id)
    with caplog.at_level("ERROR", logger="batches.interactive.feed"):
        completion = client.chat.completions.create(
            model="boardwalk/tiny-chat",
            messages=[{"role": "user", "content": CONTENT_MARKER}],
            max_completion_tokens=4,
        )

    assert tampered and completion.usage is not None and completion.usage.completion_tokens > 0
    refusals = [r for r in caplog.records if "interactive request refused" in r.getMessage()]
    # The type and where it was raised (the message could quote the content; it never does).
    assert [r.getMessage().splitlines()[0] for r in refusals] == [
        "interactive request refused: cryptography.exceptions.InvalidTag"
    ]
    assert all('batches/interactive/feed.py", line' in r.getMessage() for r in refusals)
    assert all(CONTENT_MARKER not in r.getMessage() for r in caplog.records)
    metered = UsageEvent.objects.filter(org=tenant.org)
    assert {(e.batch_id, e.request_id, e.item_id, e.attempt) for e in metered} == {
        ("", metered[0].request_id, metered[0].item_id, metered[0].attempt)  # one request, once
    }
    assert metered.filter(kind=UsageEvent.Kind.OUTPUT_TOKENS).count() == 1
    after = credit_for_org(org_id=tenant.org.id)
    assert after.balance < before.balance and after.held == before.held  # charged, released
