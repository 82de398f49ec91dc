"""Webhooks (docs/API.md "Webhooks"): endpoints API, the outbox, signed at-least-once delivery, SSRF
rules.

A local receiver stands in for the customer's endpoint; it is reachable only because the
test names it in BOARDWALK_OUTBOUND_ALLOW. Time moves with boardwalk.clock, never sleep.
"""

from __future__ import annotations

import datetime as dt
import socket
import threading
import time
from contextlib import ExitStack

import orjson
import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from standardwebhooks import Webhook

from batches.lifecycle import batch_finalize
from boardwalk import clock
from boardwalk.models import MetricCounter
from project.worker_runtime import WorkerRuntime
from tests.conftest import Api, Tenant
from tests.webhooks.conftest import ALL_TYPES, cancelled_batch, deliver_due, register
from tests.webhooks.receiver import Receiver, free_port
from webhooks import services
from webhooks.delivery import BACKOFF_SECONDS, deliveries_due, delivery_attempt
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookEvent

pytestmark = pytest.mark.django_db


def test_endpoint_api_create_list_get_delete(api: Api, tenant: Tenant, other_tenant, receiver):
    created = register(api, receiver.url, event_types=["batch.failed", "batch.completed"])
    assert created["id"].startswith("we_") and created["object"] == "webhook_endpoint"
    assert created["signing_secret"].startswith("whsec_")
    assert created["signing_secret_hint"] == "whsec_..." + created["signing_secret"][-5:-1]
    assert created["event_types"] == ["batch.completed", "batch.failed"]
    assert created["updated_at"] == created["created_at"]
    listed = api.get("/v1/webhook_endpoints").json()
    assert [e["id"] for e in listed["data"]] == [created["id"]]
    assert "signing_secret" not in listed["data"][0]  # shown once, at creation
    assert listed["data"][0]["signing_secret_hint"] == created["signing_secret_hint"]
    assert api.get(f"/v1/webhook_endpoints/{created['id']}").json()["url"] == receiver.url
    # Read keys list; only write keys register, change or delete.
    assert api.get("/v1/webhook_endpoints", key=tenant.read_key).status_code == 200
    body = {"name": "x", "url": receiver.url, "event_types": ALL_TYPES}
    assert api.post("/v1/webhook_endpoints", body, key=tenant.read_key).status_code == 403
    # Another organization sees nothing of it.
    assert other_tenant.api.get(f"/v1/webhook_endpoints/{created['id']}").status_code == 404
    assert other_tenant.api.delete(f"/v1/webhook_endpoints/{created['id']}").status_code == 404
    deleted = api.delete(f"/v1/webhook_endpoints/{created['id']}").json()
    assert deleted == {"id": created["id"], "object": "webhook_endpoint.deleted", "deleted": True}
    assert api.get("/v1/webhook_endpoints").json()["data"] == []


_OK = {"name": "hook", "url": "https://example.com/h", "event_types": ["batch.completed"]}


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({**_OK, "url": "http://example.com/hook"}, "invalid_webhook_url", "url"),  # not https
        ({**_OK, "url": "ftp://example.com/hook"}, "invalid_webhook_url", "url"),
        ({**_OK, "url": "https://user:pw@example.com/hook"}, "invalid_webhook_url", "url"),
        ({**_OK, "url": 5}, "invalid_webhook_url", "url"),
        ({**_OK, "url": ""}, "invalid_webhook_url", "url"),
        ({**_OK, "url": "https://exa mple.com/"}, "invalid_webhook_url", "url"),
        ({**_OK, "url": "https://exam\nple.com/"}, "invalid_webhook_url", "url"),
        ({**_OK, "url": "https://exam\tple.com/"}, "invalid_webhook_url", "url"),
        ({**_OK, "url": "https://exam\x00ple.com/"}, "invalid_webhook_url", "url"),
        ({**_OK, "url": "https://exam\u200bple.com/"}, "invalid_webhook_url", "url"),
        ({**_OK, "url": "https://exa<mple.com/"}, "invalid_webhook_url", "url"),
        ({**_OK, "url": "https://example.com/a b"}, "invalid_webhook_url", "url"),
        ({"name": "hook", "event_types": ["batch.completed"]}, "missing_required_parameter", "url"),
        (
            {"url": "https://example.com/h", "event_types": ["batch.completed"]},
            "missing_required_parameter",
            "name",
        ),
        (
            {"name": "hook", "url": "https://example.com/h"},
            "missing_required_parameter",
            "event_types",
        ),
        ({**_OK, "name": ""}, "invalid_name", "name"),
        ({**_OK, "name": "   "}, "invalid_name", "name"),
        ({**_OK, "name": "x" * 129}, "invalid_name", "name"),
        ({**_OK, "name": 7}, "invalid_name", "name"),
        ({**_OK, "name": "bell\x07"}, "invalid_name", "name"),
        (
            {**_OK, "event_types": ["batch.completed", "batch.started"]},
            "invalid_webhook_events",
            "event_types",
        ),
        ({**_OK, "event_types": ["response.completed"]}, "invalid_webhook_events", "event_types"),
        ({**_OK, "event_types": []}, "invalid_webhook_events", "event_types"),
        ({**_OK, "event_types": "batch.completed"}, "invalid_webhook_events", "event_types"),
        ({**_OK, "events": ["batch.completed"]}, "unknown_parameter", "events"),  # the old name
        ({**_OK, "signing_secret": "mine"}, "unknown_parameter", "signing_secret"),
    ],
)
def test_bad_endpoint_registrations_are_400_and_create_nothing(api: Api, body, code, param):
    response = api.post("/v1/webhook_endpoints", body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
    assert response["x-should-retry"] == "false"
    assert api.get("/v1/webhook_endpoints").json()["data"] == []
    assert not WebhookEndpoint.objects.exists()


def test_past_the_endpoint_cap_a_create_is_a_409_and_creates_nothing(api: Api):
    from webhooks.services import MAX_ENDPOINTS_PER_ORG

    for i in range(MAX_ENDPOINTS_PER_ORG):
        assert api.post("/v1/webhook_endpoints", {**_OK, "name": f"e{i}"}).status_code == 200
    response = api.post("/v1/webhook_endpoints", {**_OK, "name": "one-more"})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "too_many_webhook_endpoints"
    assert "delete one first" in response.json()["error"]["message"]
    assert response["x-should-retry"] == "false"  # the SDK must not resend it
    assert WebhookEndpoint.objects.count() == MAX_ENDPOINTS_PER_ORG
    assert not WebhookEndpoint.objects.filter(name="one-more").exists()


def test_unknown_event_type_is_named_in_the_error(api: Api):
    body = {**_OK, "event_types": ["batch.completed", "batch.started"]}
    message = api.post("/v1/webhook_endpoints", body).json()["error"]["message"]
    assert "'batch.started'" in message


def test_terminal_batch_event_is_delivered_signed_and_content_free(
    api: Api, tenant: Tenant, catalog_model, receiver
):
    secret = register(api, receiver.url)["signing_secret"]
    register(api, "https://example.com/never", event_types=["batch.completed"])  # not subscribed
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


@pytest.mark.parametrize(
    ("changes", "code", "param"),
    [
        ({"url": "https://exa mple.com/"}, "invalid_webhook_url", "url"),
        ({"url": "https://exam\nple.com/"}, "invalid_webhook_url", "url"),
        ({"url": None}, "invalid_webhook_url", "url"),
        ({"name": None}, "invalid_name", "name"),
        ({"name": "ok", "event_types": ["batch.started"]}, "invalid_webhook_events", "event_types"),
        ({"events": ["batch.completed"]}, "unknown_parameter", "events"),
    ],
)
def test_bad_updates_are_400_and_change_nothing(api: Api, receiver, changes, code, param):
    endpoint = register(api, receiver.url)
    before = WebhookEndpoint.objects.values().get()
    with clock.travel(dt.timedelta(seconds=5)):  # a write would move updated_at
        response = api.post(f"/v1/webhook_endpoints/{endpoint['id']}", changes)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
    assert WebhookEndpoint.objects.values().get() == before


def test_rotated_secret_kept_for_24_hours_signs_deliveries_then_stops(
    api: Api, catalog_model, receiver
):
    endpoint = register(api, receiver.url)
    old = endpoint["signing_secret"]
    rotated = api.post(
        f"/v1/webhook_endpoints/{endpoint['id']}/rotate_secret",
        {"keep_old_secret_active_for_24_hours": True},
    ).json()
    new = rotated["signing_secret"]
    assert new != old
    assert "signing_secret" not in api.get(f"/v1/webhook_endpoints/{endpoint['id']}").json()
    cancelled_batch(api)
    assert deliver_due() == ["delivered"]
    [got] = receiver.received
    assert len(got.headers["webhook-signature"].split()) == 2
    for secret in (new, old):  # a receiver on either secret accepts it
        Webhook(secret).verify(got.body, got.headers)
    with clock.travel(dt.timedelta(hours=24, seconds=1)):
        test = api.post(
            f"/v1/webhook_endpoints/{endpoint['id']}/test", {"event_type": "batch.completed"}
        )
    assert test.status_code == 200 and test.json()["status_code"] == 200
    assert len(receiver.received[-1].headers["webhook-signature"].split()) == 1
    bad = api.post(
        f"/v1/webhook_endpoints/{endpoint['id']}/rotate_secret",
        {"keep_old_secret_active_for_24_hours": "yes"},
    )
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_request")
    assert (
        api.post(f"/v1/webhook_endpoints/{endpoint['id']}/test", {}).json()["error"]["code"]
        == "missing_required_parameter"
    )


def test_deliveries_follow_the_updated_event_types(api: Api, catalog_model, receiver):
    endpoint = register(api, receiver.url, event_types=["batch.completed"])
    changed = api.post(
        f"/v1/webhook_endpoints/{endpoint['id']}", {"event_types": ["batch.cancelled"]}
    ).json()
    assert changed["event_types"] == ["batch.cancelled"]
    cancelled_batch(api)
    assert deliver_due() == ["delivered"]
    assert orjson.loads(receiver.received[0].body)["type"] == "batch.cancelled"


@pytest.mark.django_db(transaction=True)
def test_migration_keeps_existing_endpoints(tenant: Tenant):
    """An endpoint registered with the old `{url, events}` shape keeps its url, events and
    secret, and gains a name and `updated_at`."""
    executor = MigrationExecutor(connection)
    executor.migrate([("webhooks", "0001_webhook_outbox")])
    old_apps = executor.loader.project_state([("webhooks", "0001_webhook_outbox")]).apps
    OldEndpoint = old_apps.get_model("webhooks", "WebhookEndpoint")
    created = clock.now() - dt.timedelta(days=3)
    OldEndpoint.objects.create(
        id="we_legacy",
        org_id=tenant.org.id,
        url="https://hooks.example.com/in",
        events=["batch.failed"],
        secret_key_id="k1",
        wrapped_secret=b"wrapped",
        created_at=created,
    )
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes("webhooks"))
    row = WebhookEndpoint.objects.get(id="we_legacy")
    assert (row.name, row.url, row.event_types) == (
        "hooks.example.com",
        "https://hooks.example.com/in",
        ["batch.failed"],
    )
    assert (row.secret_key_id, bytes(row.wrapped_secret)) == ("k1", b"wrapped")
    assert row.updated_at == row.created_at == created
    assert row.secret_hint == "" and row.previous_wrapped_secret is None
    shown = tenant.api.get("/v1/webhook_endpoints/we_legacy").json()
    assert (shown["event_types"], shown["signing_secret_hint"]) == (["batch.failed"], None)


def _silent_receiver() -> socket.socket:
    """A port that takes connections and the request, and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)  # never accepted: the kernel completes connects and buffers the body
    return listener


def test_a_test_delivery_to_a_silent_receiver_ends_within_its_bound_as_unreachable(
    api: Api, settings, monkeypatch
):
    silent = _silent_receiver()
    try:
        port = silent.getsockname()[1]
        settings.OUTBOUND_ALLOW = [f"127.0.0.1:{port}"]
        created = register(api, f"http://127.0.0.1:{port}/hook")
        # The bound itself, shortened so the test does not wait the real one out.
        monkeypatch.setattr(services, "TEST_TIMEOUT_SECONDS", 0.3)
        response = api.post(
            f"/v1/webhook_endpoints/{created['id']}/test", {"event_type": "batch.completed"}
        )
    finally:
        silent.close()
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "webhook_endpoint_unreachable"
    assert "timeout" in response.json()["error"]["message"]


@pytest.mark.django_db(transaction=True)
def test_an_org_runs_a_bounded_number_of_tests_at_once_and_others_are_not_held(
    api: Api, other_tenant, receiver, settings
):
    other = Receiver().start()
    settings.OUTBOUND_ALLOW = [receiver.target, other.target]
    mine = register(api, receiver.url)
    theirs = register(other_tenant.api, other.url)
    endpoint = WebhookEndpoint.objects.get(id=mine["id"])
    receiver.hold = threading.Event()
    held = [
        threading.Thread(
            target=services.webhook_endpoint_test,
            kwargs={"endpoint": endpoint, "event_type": "batch.completed"},
        )
        for _ in range(services.MAX_CONCURRENT_TESTS_PER_ORG)
    ]
    try:
        for thread in held:
            thread.start()
        deadline = time.monotonic() + 30
        while len(receiver.received) < len(held) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(receiver.received) == len(held)

        refused = api.post(
            f"/v1/webhook_endpoints/{mine['id']}/test", {"event_type": "batch.failed"}
        )
        assert refused.status_code == 429, refused.content
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert refused["Retry-After"] == "5" and refused["x-should-retry"] == "true"
        assert len(receiver.received) == len(held)  # nothing was sent for it
        # Another organization's test is not counted against this one's.
        answered = other_tenant.api.post(
            f"/v1/webhook_endpoints/{theirs['id']}/test", {"event_type": "batch.failed"}
        )
        assert answered.status_code == 200, answered.content
        assert len(other.received) == 1
    finally:
        receiver.hold.set()
        for thread in held:
            thread.join(timeout=30)
        other.stop()
    # The slots were given back: the organization tests again.
    again = api.post(f"/v1/webhook_endpoints/{mine['id']}/test", {"event_type": "batch.failed"})
    assert again.status_code == 200, again.content
    assert again.json()["status_code"] == 200
