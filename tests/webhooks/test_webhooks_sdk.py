"""The `openai` SDK's `client.webhooks` drives the endpoints against the live server under
strict response validation, sync and async, and its `unwrap` verifies what Boardwalk's
delivery code sends (docs/API.md "Webhooks")."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI, InvalidWebhookSignatureError, OpenAI
from openai.types.webhooks import (
    BatchCancelledWebhookEvent,
    BatchFailedWebhookEvent,
    DeletedWebhookEndpoint,
    WebhookEndpoint,
    WebhookEndpointTestResult,
    WebhookEndpointWithSecret,
    WebhookEventTypeList,
)

from boardwalk import clock
from tests.conftest import Api, Tenant
from tests.webhooks.conftest import ALL_TYPES, cancelled_batch, deliver_due, register
from tests.webhooks.receiver import Receiver
from webhooks.models import WebhookEndpoint as EndpointRow
from webhooks.models import WebhookEvent

pytestmark = pytest.mark.django_db(transaction=True)


def sdk(live_server: Any, key: str) -> OpenAI:
    return OpenAI(
        base_url=f"{live_server.url}/v1",
        api_key=key,
        max_retries=0,
        _strict_response_validation=True,
    )


def exercise(
    webhooks: Any, run: Callable[[Any], Any], collect: Callable[[Any], list[Any]], recv: Receiver
) -> None:
    """Every method of `client.webhooks`, in order; `run` resolves a call's answer (the value
    itself, or the awaited coroutine), `collect` walks every page of a list."""
    created = run(
        webhooks.create(
            name="orders", url=recv.url, event_types=["batch.failed", "batch.completed"]
        )
    )
    assert isinstance(created, WebhookEndpointWithSecret)
    assert created.id.startswith("we_") and created.object == "webhook_endpoint"
    assert (created.name, created.url) == ("orders", recv.url)
    assert created.event_types == ["batch.completed", "batch.failed"]
    assert created.signing_secret.startswith("whsec_")
    assert created.signing_secret_hint == "whsec_..." + created.signing_secret.rstrip("=")[-4:]
    assert created.updated_at == created.created_at

    got = run(webhooks.retrieve(created.id))
    assert isinstance(got, WebhookEndpoint)
    shown = created.to_dict()
    del shown["signing_secret"]  # only from create and rotate_secret
    assert got.to_dict() == shown

    second = run(webhooks.create(name="b", url=recv.url, event_types=["batch.expired"]))
    third = run(webhooks.create(name="c", url=recv.url, event_types=ALL_TYPES))
    page = run(webhooks.list(limit=2))
    assert [e.id for e in page.data] == [third.id, second.id] and page.has_more is True
    assert [e.id for e in collect(webhooks.list(limit=2))] == [third.id, second.id, created.id]

    with clock.travel(dt.timedelta(seconds=30)):
        updated = run(
            webhooks.update(
                created.id, name="orders-v2", url=recv.url + "?v=2", event_types=["batch.failed"]
            )
        )
    assert isinstance(updated, WebhookEndpoint)
    assert (updated.name, updated.url, updated.event_types) == (
        "orders-v2",
        recv.url + "?v=2",
        ["batch.failed"],
    )
    assert updated.updated_at is not None and updated.updated_at >= created.created_at + 30
    with clock.travel(dt.timedelta(seconds=60)):
        unchanged = run(webhooks.update(created.id, name="orders-v2"))
    assert unchanged.updated_at == updated.updated_at  # nothing changed: not advanced

    types = run(webhooks.event_types.list())
    assert isinstance(types, WebhookEventTypeList) and types.data == ALL_TYPES

    result = run(webhooks.test(created.id, event_type="batch.failed"))
    assert isinstance(result, WebhookEndpointTestResult)
    assert (result.object, result.webhook_endpoint_id, result.event_type) == (
        "webhook_endpoint.test",
        created.id,
        "batch.failed",
    )
    assert (result.status_code, result.success) == (200, True)
    [delivery] = recv.received
    assert delivery.path == "/hook?v=2"  # the updated url
    event = webhooks.unwrap(delivery.body, delivery.headers, secret=created.signing_secret)
    assert isinstance(event, BatchFailedWebhookEvent)
    assert event.id.startswith("evt_") and event.data.id == "batch_test"
    recv.status = 410
    assert run(webhooks.test(created.id, event_type="batch.completed")).status_code == 410
    recv.status = 200

    rotated = run(webhooks.rotate_secret(created.id))
    assert isinstance(rotated, WebhookEndpointWithSecret)
    assert rotated.signing_secret != created.signing_secret
    assert rotated.signing_secret_hint != created.signing_secret_hint
    run(webhooks.test(created.id, event_type="batch.expired"))
    signed = recv.received[-1]
    webhooks.unwrap(signed.body, signed.headers, secret=rotated.signing_secret)
    with pytest.raises(InvalidWebhookSignatureError):  # dropped at once: not kept
        webhooks.unwrap(signed.body, signed.headers, secret=created.signing_secret)

    kept = run(webhooks.rotate_secret(created.id, keep_old_secret_active_for_24_hours=True))
    run(webhooks.test(created.id, event_type="batch.cancelled"))
    signed = recv.received[-1]
    for secret in (kept.signing_secret, rotated.signing_secret):  # both, for 24 hours
        assert isinstance(
            webhooks.unwrap(signed.body, signed.headers, secret=secret), BatchCancelledWebhookEvent
        )

    deleted = run(webhooks.delete(created.id))
    assert isinstance(deleted, DeletedWebhookEndpoint)
    assert (deleted.id, deleted.object, deleted.deleted) == (
        created.id,
        "webhook_endpoint.deleted",
        True,
    )
    with pytest.raises(openai.NotFoundError):
        run(webhooks.retrieve(created.id))
    assert [e.id for e in collect(webhooks.list())] == [third.id, second.id]


def test_sync_sdk_drives_every_webhooks_method(live_server, tenant: Tenant, receiver):
    with sdk(live_server, tenant.write_key) as client:
        exercise(client.webhooks, lambda answer: answer, list, receiver)
    assert EndpointRow.objects.count() == 2


def test_async_sdk_drives_every_webhooks_method(live_server, tenant: Tenant, receiver):
    async def answer(awaitable: Any) -> Any:  # a coroutine, or the list's AsyncPaginator
        return await awaitable

    async def every_page(paginator: Any) -> list[Any]:
        return [item async for item in paginator]

    with asyncio.Runner() as runner:
        client = AsyncOpenAI(
            base_url=f"{live_server.url}/v1",
            api_key=tenant.write_key,
            max_retries=0,
            _strict_response_validation=True,
        )
        try:
            exercise(
                client.webhooks,
                lambda awaitable: runner.run(answer(awaitable)),
                lambda paginator: runner.run(every_page(paginator)),
                receiver,
            )
        finally:
            runner.run(client.close())
    assert EndpointRow.objects.count() == 2


@pytest.mark.django_db
def test_unwrap_verifies_a_real_batch_delivery_and_rejects_a_tampered_one(
    api: Api, catalog_model, receiver
):
    secret = register(api, receiver.url)["signing_secret"]
    batch_id = cancelled_batch(api)
    assert deliver_due() == ["delivered"]
    [got] = receiver.received
    webhooks = OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1").webhooks
    event = webhooks.unwrap(got.body, got.headers, secret=secret)
    stored = WebhookEvent.objects.get(batch_id=batch_id)
    assert isinstance(event, BatchCancelledWebhookEvent)
    assert (event.id, event.type, event.object) == (stored.id, "batch.cancelled", "event")
    assert (event.created_at, event.data.id) == (clock.unix(stored.created_at), batch_id)
    tampered = got.body.replace(batch_id.encode(), b"batch_" + b"x" * 24)
    with pytest.raises(InvalidWebhookSignatureError):
        webhooks.unwrap(tampered, got.headers, secret=secret)
    with pytest.raises(InvalidWebhookSignatureError):
        webhooks.unwrap(got.body, {**got.headers, "webhook-id": "evt_other"}, secret=secret)
    other_secret = register(api, receiver.url)["signing_secret"]
    with pytest.raises(InvalidWebhookSignatureError):
        webhooks.unwrap(got.body, got.headers, secret=other_secret)


def _row_state() -> list[tuple[Any, ...]]:
    return list(
        EndpointRow.objects.order_by("id").values_list(
            "id", "name", "url", "event_types", "updated_at", "secret_key_id", "wrapped_secret"
        )
    )


def _refused(call: Callable[[], Any], error: type[openai.APIStatusError], code: str) -> Any:
    with pytest.raises(error) as refused:
        call()
    assert refused.value.code == code
    return refused.value


@pytest.mark.parametrize(
    "url",
    [
        "https://exa mple.com/",
        "https://exam\nple.com/",
        "https://exam\rple.com/",
        "https://exam\tple.com/",
        " https://example.com/",
        "",
    ],
)
def test_sdk_bad_urls_are_400_on_create_and_update_and_change_nothing(
    live_server, tenant: Tenant, receiver, url
):
    with sdk(live_server, tenant.write_key) as client:
        endpoint = client.webhooks.create(name="a", url=receiver.url, event_types=ALL_TYPES)
        before = _row_state()
        error = _refused(
            lambda: client.webhooks.create(name="b", url=url, event_types=ALL_TYPES),
            openai.BadRequestError,
            "invalid_webhook_url",
        )
        assert error.param == "url"
        _refused(
            lambda: client.webhooks.update(endpoint.id, name="renamed", url=url),
            openai.BadRequestError,
            "invalid_webhook_url",
        )
        assert _row_state() == before  # nothing created, and the name not half-applied


def test_sdk_bad_inputs_scopes_and_other_orgs_change_nothing(
    live_server, tenant: Tenant, other_tenant: Tenant, receiver, settings
):
    with (
        sdk(live_server, tenant.write_key) as client,
        sdk(live_server, tenant.read_key) as reader,
        sdk(live_server, other_tenant.write_key) as stranger,
    ):
        endpoint = client.webhooks.create(name="a", url=receiver.url, event_types=ALL_TYPES)
        before = _row_state()
        unknown = _refused(
            lambda: client.webhooks.create(
                name="b",
                url=receiver.url,
                event_types=["batch.completed", "response.completed"],  # an OpenAI type
            ),
            openai.BadRequestError,
            "invalid_webhook_events",
        )
        assert "'response.completed'" in unknown.message and unknown.param == "event_types"
        _refused(
            lambda: client.webhooks.update(endpoint.id, event_types=["batch.started"]),
            openai.BadRequestError,
            "invalid_webhook_events",
        )
        _refused(
            lambda: client.webhooks.create(name="", url=receiver.url, event_types=ALL_TYPES),
            openai.BadRequestError,
            "invalid_name",
        )
        _refused(
            lambda: client.webhooks.test(endpoint.id, event_type="response.completed"),
            openai.BadRequestError,
            "invalid_webhook_events",
        )
        _refused(lambda: client.webhooks.list(limit=0), openai.BadRequestError, "invalid_limit")
        _refused(
            lambda: client.webhooks.list(after="we_missing"),
            openai.BadRequestError,
            "invalid_cursor",
        )
        # A read key reads, and changes nothing.
        assert reader.webhooks.retrieve(endpoint.id).id == endpoint.id
        assert [e.id for e in reader.webhooks.list()] == [endpoint.id]
        assert reader.webhooks.event_types.list().data == ALL_TYPES
        for write in (
            lambda: reader.webhooks.create(name="b", url=receiver.url, event_types=ALL_TYPES),
            lambda: reader.webhooks.update(endpoint.id, name="mine"),
            lambda: reader.webhooks.rotate_secret(endpoint.id),
            lambda: reader.webhooks.test(endpoint.id, event_type="batch.completed"),
            lambda: reader.webhooks.delete(endpoint.id),
        ):
            _refused(write, openai.PermissionDeniedError, "insufficient_scope")
        # Another organization finds nothing.
        for foreign in (
            lambda: stranger.webhooks.retrieve(endpoint.id),
            lambda: stranger.webhooks.update(endpoint.id, name="mine"),
            lambda: stranger.webhooks.rotate_secret(endpoint.id),
            lambda: stranger.webhooks.test(endpoint.id, event_type="batch.completed"),
            lambda: stranger.webhooks.delete(endpoint.id),
        ):
            _refused(foreign, openai.NotFoundError, "not_found")
        assert list(stranger.webhooks.list()) == []
        assert receiver.received == []  # no test delivery was sent for any of them
        assert _row_state() == before
        # A test that gets no HTTP answer at all is an error naming why, not a result.
        receiver.stop()
        down = _refused(
            lambda: client.webhooks.test(endpoint.id, event_type="batch.completed"),
            openai.BadRequestError,
            "webhook_endpoint_unreachable",
        )
        assert "connect" in down.message
        assert _row_state() == before
