"""What the official SDK does with each answer: how many times it sends, how long it waits.

The server under test is real (a live server); only the client side is instrumented: a
transport counts the requests the SDK sends and the SDK's retry sleep is recorded instead
of slept (docs/API.md "Errors": retry headers, x-request-id).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import openai._base_client as sdk_base
import pytest
from openai import OpenAI

from batches.idempotency import request_hash
from batches.models import Batch, IdempotencyRecord
from inference.demo.model import demo_revision_fields
from inference.services import catalog_model_create, revision_create
from tests.batches.test_create import _hold_key_in_another_thread
from tests.conftest import Tenant, jsonl, make_tenant, request_line

pytestmark = pytest.mark.django_db(transaction=True)

CREATE = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}


class CountingTransport(httpx2.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.responses: list[httpx2.Response] = []

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = super().handle_request(request)
        self.responses.append(response)
        return response

    def take(self) -> list[httpx2.Response]:
        taken, self.responses = self.responses, []
        return taken


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The SDK's retry waits, recorded instead of slept (no test waits for time to pass)."""
    waited: list[float] = []
    monkeypatch.setattr(sdk_base.time, "sleep", waited.append)
    return waited


def client_for(live_server: Any, key: str) -> tuple[OpenAI, CountingTransport]:
    transport = CountingTransport()
    client = OpenAI(
        base_url=f"{live_server.url}/v1",
        api_key=key,
        max_retries=2,
        _strict_response_validation=True,
        http_client=httpx2.Client(transport=transport),
    )
    return client, transport


@pytest.fixture
def sdk(live_server: Any, tenant: Tenant) -> Iterator[tuple[OpenAI, CountingTransport]]:
    client, transport = client_for(live_server, tenant.write_key)
    yield client, transport
    client.close()


def upload(client: OpenAI, *rows: dict[str, Any]) -> str:
    return client.files.create(file=("r.jsonl", jsonl(*rows)), purpose="batch").id


def assert_final(responses: list[httpx2.Response], *, attempts: int, status: int) -> None:
    assert [r.status_code for r in responses] == [status] * attempts
    ids = [r.headers.get("x-request-id") for r in responses]
    assert all(i and i.startswith("hreq_") for i in ids) and len(set(ids)) == attempts


def test_every_answer_carries_a_request_id_the_sdk_exposes(sdk, catalog_model, live_server):
    client, transport = sdk
    file_id = upload(client, request_line())
    retrieved = client.files.retrieve(file_id)
    assert retrieved._request_id is not None and retrieved._request_id.startswith("hreq_")
    with pytest.raises(openai.NotFoundError) as missing:
        client.batches.retrieve("batch_missing")
    assert missing.value.request_id and missing.value.request_id.startswith("hreq_")
    transport.take()
    # Outside the API too: health check, unknown paths, the admin.
    with httpx2.Client() as plain:
        for path in ("/healthz", "/nowhere", "/admin/login/"):
            assert plain.get(f"{live_server.url}{path}").headers["x-request-id"].startswith("hreq_")


@pytest.mark.parametrize("case", ["missing_key", "not_found", "scope", "reused", "conflict_state"])
def test_answers_that_cannot_succeed_are_sent_once(
    case, sdk, sleeps, catalog_model, tenant, live_server
):
    client, transport = sdk
    file_id = upload(client, request_line())
    transport.take()
    if case == "missing_key":
        with pytest.raises(openai.BadRequestError):
            client.batches.create(input_file_id=file_id, **CREATE)
        status = 400
    elif case == "not_found":
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve("file-missing")
        status = 404
    elif case == "scope":
        reader, transport = client_for(live_server, tenant.read_key)
        with reader, pytest.raises(openai.PermissionDeniedError):
            reader.batches.create(
                input_file_id=file_id, **CREATE, extra_headers={"Idempotency-Key": "k"}
            )
        status = 403
    elif case == "reused":
        client.batches.create(
            input_file_id=file_id, **CREATE, extra_headers={"Idempotency-Key": "k"}
        )
        other = upload(client, request_line())
        transport.take()
        with pytest.raises(openai.ConflictError) as error:
            client.batches.create(
                input_file_id=other, **CREATE, extra_headers={"Idempotency-Key": "k"}
            )
        assert error.value.code == "idempotency_key_reused"
        status = 409
    else:
        batch = client.batches.create(
            input_file_id=file_id, **CREATE, extra_headers={"Idempotency-Key": "k"}
        )
        Batch.objects.filter(id=batch.id).update(status="completed")
        transport.take()
        with pytest.raises(openai.ConflictError) as error:
            client.batches.cancel(batch.id)
        assert error.value.code == "batch_not_cancellable"
        status = 409
    responses = transport.take()
    assert_final(responses, attempts=1, status=status)
    assert responses[0].headers["x-should-retry"] == "false"
    assert "retry-after" not in responses[0].headers
    assert sleeps == []


def test_insufficient_credit_is_sent_once(live_server, sleeps, catalog_model):
    poor = make_tenant("poor", credit=0)
    client, transport = client_for(live_server, poor.write_key)
    file_id = upload(client, request_line())
    transport.take()
    with client, pytest.raises(openai.APIStatusError) as error:
        client.batches.create(
            input_file_id=file_id, **CREATE, extra_headers={"Idempotency-Key": "k"}
        )
    assert error.value.status_code == 402
    assert_final(transport.take(), attempts=1, status=402)
    assert sleeps == []


def test_private_batch_too_large_is_never_resent(sdk, sleeps, deployment):
    client, transport = sdk
    rows = [request_line(f"t{i}", model="support-agent") for i in range(96)]
    file_id = upload(client, *rows)
    transport.take()
    with pytest.raises(openai.RateLimitError) as error:
        client.batches.create(
            input_file_id=file_id, **CREATE, extra_headers={"Idempotency-Key": "k"}
        )
    assert error.value.code == "private_batch_too_large"
    responses = transport.take()
    assert_final(responses, attempts=1, status=429)
    assert responses[0].headers["x-should-retry"] == "false"
    assert "retry-after" not in responses[0].headers
    assert sleeps == []


def test_too_many_unfinished_batches_waits_retry_after_then_retries(sdk, sleeps, catalog_model):
    client, transport = sdk
    for i in range(4):
        client.batches.create(
            input_file_id=upload(client, request_line()),
            **CREATE,
            extra_headers={"Idempotency-Key": f"k{i}"},
        )
    file_id = upload(client, request_line())
    transport.take()
    with pytest.raises(openai.RateLimitError) as error:
        client.batches.create(
            input_file_id=file_id, **CREATE, extra_headers={"Idempotency-Key": "k5"}
        )
    assert error.value.code == "too_many_unfinished_batches"
    responses = transport.take()
    assert_final(responses, attempts=3, status=429)
    assert {r.headers["retry-after"] for r in responses} == {"60"}
    assert {r.headers["x-should-retry"] for r in responses} == {"true"}
    assert sleeps == [60.0, 60.0]
    # A capacity refusal does not consume the key: once a slot frees, the same call succeeds.
    Batch.objects.filter(org__name="acme").update(status="completed")
    batch = client.batches.create(
        input_file_id=file_id, **CREATE, extra_headers={"Idempotency-Key": "k5"}
    )
    assert batch.status == "in_progress"


def test_idempotency_key_in_use_waits_and_retries(sdk, sleeps, catalog_model, tenant, settings):
    settings.IDEMPOTENCY_WAIT_SECONDS = 0
    client, transport = sdk
    file_id = upload(client, request_line())
    body = {"input_file_id": file_id, **CREATE}
    # A first request with this key is still being processed: a live owner holds it (on
    # PostgreSQL a record without a live owner is a crashed request, taken over at once).
    release = _hold_key_in_another_thread(tenant.org, "busy", request_hash(body), die=False)
    transport.take()
    try:
        with pytest.raises(openai.ConflictError) as error:
            client.batches.create(**body, extra_headers={"Idempotency-Key": "busy"})
    finally:
        release.set()
        release.thread.join()
    assert error.value.code == "idempotency_key_in_use"
    responses = transport.take()
    assert_final(responses, attempts=3, status=409)
    assert {r.headers["retry-after"] for r in responses} == {"1"}
    assert {r.headers["x-should-retry"] for r in responses} == {"true"}
    assert sleeps == [1.0, 1.0]
    assert not Batch.objects.exists()


def test_model_unavailable_503_carries_retry_after_and_is_retried(
    sdk, sleeps, catalog_model, tmp_path: Path
):
    broken = revision_create(**demo_revision_fields(tmp_path / "gone", "tiny"))
    catalog_model_create(name="boardwalk/broken", revision=broken, prices=(1, 1, 1))
    client, transport = sdk
    file_id = upload(client, request_line(model="boardwalk/broken"))
    transport.take()
    with pytest.raises(openai.InternalServerError) as error:
        client.batches.create(
            input_file_id=file_id, **CREATE, extra_headers={"Idempotency-Key": "k"}
        )
    assert error.value.status_code == 503
    responses = transport.take()
    assert_final(responses, attempts=3, status=503)
    assert {r.headers["retry-after"] for r in responses} == {"5"}
    assert sleeps == [5.0, 5.0]
    assert not Batch.objects.exists()
    assert not IdempotencyRecord.objects.exists()  # the refusal released the key
