"""Webhooks (SPEC §10b): endpoints API, the outbox, signed at-least-once delivery, SSRF rules.

A local receiver stands in for the customer's endpoint; it is reachable only because the
test names it in BOARDWALK_OUTBOUND_ALLOW. Time moves with boardwalk.clock, never sleep.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import orjson
import pytest
from standardwebhooks import Webhook

from batches.lifecycle import batch_finalize
from boardwalk import clock
from boardwalk.models import MetricCounter
from boardwalk.worker_runtime import WorkerRuntime
from tests.batches.conftest import rows, submit
from tests.conftest import Api, Tenant
from tests.webhooks.receiver import Receiver, free_port
from webhooks.delivery import BACKOFF_SECONDS, deliveries_due, delivery_attempt
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    recv = Receiver().start()
    settings.OUTBOUND_ALLOW = [recv.target]
    yield recv
    recv.stop()


def register(api: Api, url: str, **extra: Any) -> dict[str, Any]:
    response = api.post("/v1/webhook_endpoints", {"url": url, **extra})
    assert response.status_code == 200, response.content
    return response.json()


def cancelled_batch(api: Api, key: str = "run-1") -> str:
    """A batch made terminal (cancelled) without running the engine."""
    data = submit(api, rows(2), key=key)
    assert api.post(f"/v1/batches/{data['id']}/cancel").status_code == 200
    batch = batch_finalize(batch_id=data["id"])
    assert batch is not None and batch.status == "cancelled"
    return data["id"]


def deliver_due() -> list[str | None]:
    """What the sweep plus the actor do, in the test thread."""
    return [delivery_attempt(delivery_id=i) for i in deliveries_due()]


def test_endpoint_api_create_list_get_delete(api: Api, tenant: Tenant, other_tenant, receiver):
    created = register(api, receiver.url, events=["batch.completed", "batch.failed"])
    assert created["id"].startswith("we_") and created["object"] == "webhook_endpoint"
    assert created["secret"].startswith("whsec_")
    assert created["events"] == ["batch.completed", "batch.failed"]
    listed = api.get("/v1/webhook_endpoints").json()
    assert [e["id"] for e in listed["data"]] == [created["id"]]
    assert "secret" not in listed["data"][0]  # shown once, at creation
    assert api.get(f"/v1/webhook_endpoints/{created['id']}").json()["url"] == receiver.url
    # Read keys list; only write keys register or delete.
    assert api.get("/v1/webhook_endpoints", key=tenant.read_key).status_code == 200
    assert (
        api.post("/v1/webhook_endpoints", {"url": receiver.url}, key=tenant.read_key).status_code
        == 403
    )
    # Another organization sees nothing of it.
    assert other_tenant.api.get(f"/v1/webhook_endpoints/{created['id']}").status_code == 404
    assert other_tenant.api.delete(f"/v1/webhook_endpoints/{created['id']}").status_code == 404
    deleted = api.delete(f"/v1/webhook_endpoints/{created['id']}").json()
    assert deleted == {"id": created["id"], "object": "webhook_endpoint", "deleted": True}
    assert api.get("/v1/webhook_endpoints").json()["data"] == []


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"url": "http://example.com/hook"}, "invalid_webhook_url"),  # http, not allowed
        ({"url": "ftp://example.com/hook"}, "invalid_webhook_url"),
        ({"url": "https://user:pw@example.com/hook"}, "invalid_webhook_url"),
        ({"url": 5}, "invalid_webhook_url"),
        ({}, "invalid_webhook_url"),
        ({"url": "https://example.com/h", "events": ["batch.started"]}, "invalid_webhook_events"),
        ({"url": "https://example.com/h", "events": []}, "invalid_webhook_events"),
        ({"url": "https://example.com/h", "secret": "mine"}, "unknown_parameter"),
    ],
)
def test_bad_endpoint_registrations_are_400_and_create_nothing(api: Api, body, code):
    response = api.post("/v1/webhook_endpoints", body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
    assert response["x-should-retry"] == "false"
    assert api.get("/v1/webhook_endpoints").json()["data"] == []


def test_terminal_batch_event_is_delivered_signed_and_content_free(
    api: Api, tenant: Tenant, catalog_model, receiver
):
    secret = register(api, receiver.url)["secret"]
    register(api, "https://example.com/never", events=["batch.completed"])  # not subscribed
    batch_id = cancelled_batch(api)
    assert deliver_due() == ["delivered"]
    [got] = receiver.received
    # Standard Webhooks' own verifier accepts the signature (and checks the timestamp).
    payload = Webhook(secret).verify(got.body, got.headers)
    event = WebhookEvent.objects.get(batch_id=batch_id)
    assert payload == {
        "id": event.id,
        "object": "event",
        "type": "batch.cancelled",
        "created_at": clock.unix(event.created_at),
        "data": {"id": batch_id},
    }
    assert got.headers["webhook-id"] == event.id
    assert got.headers["content-type"] == "application/json"
    assert "x-forwarded-for" not in got.headers
    with pytest.raises(Exception):  # noqa: B017 - any verification failure
        Webhook(secret).verify(got.body.replace(b"cancelled", b"completed"), got.headers)
    attempt = WebhookAttempt.objects.get()
    assert (attempt.status_code, attempt.error, attempt.number) == (200, "", 1)
    assert attempt.latency_ms >= 0
    # Delivered once: nothing is due any more, the second message for it is a no-op.
    assert deliveries_due() == []
    assert delivery_attempt(delivery_id=attempt.delivery_id) is None
    assert len(receiver.received) == 1


def test_receiver_down_for_a_while_still_gets_the_event(api: Api, catalog_model, settings):
    port = free_port()
    receiver = Receiver(port=port)  # not started: connections are refused
    settings.OUTBOUND_ALLOW = [receiver.target]
    register(api, receiver.url)
    cancelled_batch(api)
    delivery = WebhookDelivery.objects.get()
    with ExitStack() as time_moves:
        assert deliver_due() == ["pending"]
        assert deliveries_due() == []  # backing off: nothing before its time
        receiver.start()
        receiver.status = 503  # up, but failing
        for waited in BACKOFF_SECONDS[:3]:
            time_moves.enter_context(clock.travel(dt.timedelta(seconds=waited - 1)))
            assert deliveries_due() == []
            time_moves.enter_context(clock.travel(dt.timedelta(seconds=1)))
            assert deliver_due() == ["pending"]
        receiver.status = 200
        time_moves.enter_context(clock.travel(dt.timedelta(seconds=BACKOFF_SECONDS[3])))
        assert deliver_due() == ["delivered"]
    attempts = list(WebhookAttempt.objects.filter(delivery=delivery).order_by("number"))
    assert [(a.status_code, a.error) for a in attempts] == [
        (None, "connect"),
        (503, ""),
        (503, ""),
        (503, ""),
        (200, ""),
    ]
    # The same event, the same id, every attempt.
    assert {r.headers["webhook-id"] for r in receiver.received} == {delivery.event_id}
    assert len({r.body for r in receiver.received}) == 1
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("delivered", 5, 200)
    # /metrics counts the four failed attempts, labelled by kind, never by endpoint or org.
    failures = dict(
        MetricCounter.objects.filter(name="boardwalk_webhook_failures_total").values_list(
            "labels", "value"
        )
    )
    assert failures == {'reason="error"': 1, 'reason="status"': 3}


def test_delivery_gives_up_after_24_hours(api: Api, catalog_model, receiver):
    receiver.status = 500
    register(api, receiver.url)
    cancelled_batch(api)
    with ExitStack() as time_moves:
        for _ in range(40):
            states = deliver_due()
            if states == ["failed"]:
                break
            time_moves.enter_context(clock.travel(dt.timedelta(hours=1)))
    delivery = WebhookDelivery.objects.get()
    assert delivery.state == "failed"
    assert delivery.attempts == len(receiver.received) > 3
    last = WebhookAttempt.objects.filter(delivery=delivery).order_by("-number").first()
    assert last is not None
    assert last.attempted_at - delivery.event.created_at <= dt.timedelta(hours=24)


def test_one_event_per_batch_whatever_finalization_repeats(api: Api, catalog_model, receiver):
    register(api, receiver.url)
    register(api, receiver.url)  # two endpoints: one delivery each, one event
    batch_id = cancelled_batch(api)
    assert batch_finalize(batch_id=batch_id) is not None  # a repeated finalize
    assert WebhookEvent.objects.filter(batch_id=batch_id).count() == 1
    assert WebhookDelivery.objects.count() == 2
    assert sorted(deliver_due()) == ["delivered", "delivered"]
    assert deliver_due() == []
    assert len({r.headers["webhook-id"] for r in receiver.received}) == 1
    assert len(receiver.received) == 2


def test_redirect_is_not_followed_and_counts_as_a_failure(api: Api, catalog_model, receiver):
    private = Receiver().start()  # not allowed: must never be reached
    try:
        receiver.redirect_to = f"http://127.0.0.1:{private.port}/steal"
        register(api, receiver.url)
        cancelled_batch(api)
        assert deliver_due() == ["pending"]
    finally:
        private.stop()
    assert WebhookAttempt.objects.get().status_code == 307
    assert private.received == []


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "2130706433",  # decimal loopback
        "0177.0.0.1",  # octal loopback
        "0x7f000001",  # hex loopback
        "[::1]",
        "0.0.0.0",  # noqa: S104 - a probe the client must refuse, nothing binds
        "[::ffff:127.0.0.1]",  # IPv4-mapped loopback
        "169.254.169.254",  # cloud metadata
        "10.1.2.3",
        "192.168.0.1",
        "localhost",
    ],
)
def test_private_targets_are_refused_at_delivery(api: Api, catalog_model, settings, host):
    private = Receiver().start()
    settings.OUTBOUND_ALLOW = []
    try:
        register(api, f"https://{host}:{private.port}/hook")  # names may move: checked later
        cancelled_batch(api)
        assert deliver_due() == ["pending"]
    finally:
        private.stop()
    attempt = WebhookAttempt.objects.get()
    assert (attempt.status_code, attempt.error) == (None, "not_public")
    assert private.received == []


@pytest.mark.django_db(transaction=True)
def test_crash_between_terminal_and_delivery_still_delivers(
    api: Api, catalog_model, receiver, monkeypatch, settings
):
    """The process dies after the terminal commit, before its delivery message is sent:
    the outbox row is there, and the worker's sweep delivers it."""
    settings.ITEM_LEASE_SECONDS = 30
    monkeypatch.setattr("webhooks.outbox.webhook_deliveries_send_after_commit", lambda ids: None)
    register(api, receiver.url)
    batch_id = cancelled_batch(api)
    assert WebhookDelivery.objects.get().state == "pending"
    assert receiver.received == []
    runtime = WorkerRuntime(threads=1, sweep_interval=0.5).start()
    try:
        deadline = time.monotonic() + 60
        while not receiver.received and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        runtime.stop()
    [got] = receiver.received
    assert orjson.loads(got.body)["data"] == {"id": batch_id}
    assert WebhookDelivery.objects.get().state == "delivered"
