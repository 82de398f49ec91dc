"""POST /v1/batches (docs/API.md "Batches"): acceptance, idempotency, strict bodies, capacity,
credit."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.db import connection

from batches.models import Batch, BatchItem, IdempotencyRecord
from billing.models import LedgerEntry
from billing.pricing import money_div
from billing.selectors import credit_for_org
from files.models import File
from tests.conftest import PRICES, Api, Tenant, jsonl, make_tenant, postgres_only, request_line

pytestmark = pytest.mark.django_db


def submission(file_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        **extra,
    }


def create(api: Api, file_id: str, key: str = "run-1", **extra: Any) -> Any:
    return api.post("/v1/batches", submission(file_id, **extra), HTTP_IDEMPOTENCY_KEY=key)


def test_create_pins_revision_fixes_prices_and_holds_credit(
    api: Api, tenant: Tenant, uploaded: dict
):
    before = credit_for_org(org_id=tenant.org.id)
    response = create(api, uploaded["id"])
    assert response.status_code == 200, response.content
    data = response.json()
    batch = Batch.objects.get(id=data["id"])
    assert data["object"] == "batch"
    assert data["status"] == "in_progress"
    assert data["request_counts"] == {"total": 2, "completed": 0, "failed": 0}
    assert data["model_config_id"] == batch.revision_id
    assert data["billing"] == "catalog"
    assert data["pricing"] == {
        "unit": "microusd_per_million_tokens",
        "input": str(PRICES[0]),
        "cached_input": str(PRICES[1]),
        "output": str(PRICES[2]),
    }
    assert data["expires_at"] - data["created_at"] == 24 * 3600
    assert data["output_file_id"] is None and data["error_file_id"] is None
    for field in ("completed_at", "cancelled_at", "failed_at", "expired_at", "errors", "metadata"):
        assert data[field] is None
    items = list(BatchItem.objects.filter(batch=batch).order_by("index"))
    assert [i.custom_id for i in items] == ["task-1", "task-2"]
    assert all(i.prompt_tokens > 0 and i.state == "pending" for i in items)
    hold = LedgerEntry.objects.get(batch_id=batch.id, kind="hold").amount_microusd
    # Holds round like charges (half up, per request: docs/BILLING.md).
    expected = sum(money_div(i.prompt_tokens * PRICES[0] + 8 * PRICES[2], 1_000_000) for i in items)
    assert hold == expected == batch.hold_microusd
    after = credit_for_org(org_id=tenant.org.id)
    assert after.available == before.available - hold
    assert after.balance == before.balance


def test_revision_change_after_acceptance_does_not_affect_the_batch(
    api: Api, uploaded: dict, catalog_model
):
    from inference.services import catalog_model_set_revision, revision_create

    data = create(api, uploaded["id"]).json()
    new = revision_create(
        label="v2", weights=catalog_model.revision.weights, context_length=64, modalities=["text"]
    )
    catalog_model_set_revision(model=catalog_model, revision=new)
    assert api.get(f"/v1/batches/{data['id']}").json()["model_config_id"] == data["model_config_id"]


def test_same_key_same_body_returns_the_original_batch(api: Api, uploaded: dict):
    first = create(api, uploaded["id"]).json()
    second = create(api, uploaded["id"])
    assert second.status_code == 200
    assert second.json()["id"] == first["id"]
    assert Batch.objects.count() == 1
    assert LedgerEntry.objects.filter(kind="hold").count() == 1


def test_same_key_different_body_is_409_reused(api: Api, uploaded: dict, catalog_model):
    create(api, uploaded["id"])
    other = api.upload(jsonl(request_line())).json()["id"]
    response = create(api, other)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_key_reused"
    assert response["x-should-retry"] == "false"
    assert Batch.objects.count() == 1


def _hold_key_in_another_thread(org: Any, key: str, digest: str, *, die: bool) -> Any:
    """A concurrent request that took the key and is still working (or died: its
    connection closed without finishing). Returns the event that lets it go."""
    from batches import idempotency

    taken, release = threading.Event(), threading.Event()

    def owner() -> None:
        try:
            claim = idempotency.key_acquire(org=org, key=key, digest=digest)
            taken.set()
            if not die:
                release.wait(30)
                idempotency.key_release(claim=claim)  # type: ignore[arg-type]
                idempotency.key_done(claim=claim)  # type: ignore[arg-type]
        finally:
            connection.close()  # a dead process's connection closes like this

    thread = threading.Thread(target=owner)
    thread.start()
    assert taken.wait(10)
    if die:
        thread.join()
    release.thread = thread  # type: ignore[attr-defined]
    return release


@pytest.mark.django_db(transaction=True)
def test_key_still_in_progress_is_409_in_use_with_retry_after(
    api: Api, tenant: Tenant, uploaded: dict, settings
):
    from batches.idempotency import request_hash

    settings.IDEMPOTENCY_WAIT_SECONDS = 0
    body = submission(uploaded["id"])
    release = _hold_key_in_another_thread(tenant.org, "busy", request_hash(body), die=False)
    try:
        response = api.post("/v1/batches", body, HTTP_IDEMPOTENCY_KEY="busy")
    finally:
        release.set()
        release.thread.join()
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_key_in_use"
    assert response["Retry-After"] == "1"
    assert Batch.objects.count() == 0


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_key_of_a_request_that_died_is_taken_over_at_once(
    api: Api, tenant: Tenant, uploaded: dict, settings
):
    """Before the fix: a web process killed mid-create blocked its key for 10 minutes."""
    from batches.idempotency import request_hash

    settings.IDEMPOTENCY_WAIT_SECONDS = 0  # no waiting: the dead owner is recognised at once
    body = submission(uploaded["id"])
    _hold_key_in_another_thread(tenant.org, "crashed", request_hash(body), die=True)
    assert IdempotencyRecord.objects.filter(key="crashed", batch__isnull=True).exists()
    response = api.post("/v1/batches", body, HTTP_IDEMPOTENCY_KEY="crashed")
    assert response.status_code == 200, response.content
    assert Batch.objects.count() == 1
    assert LedgerEntry.objects.filter(kind="hold").count() == 1
    assert IdempotencyRecord.objects.get(key="crashed").batch_id == response.json()["id"]


def test_an_owner_whose_key_was_taken_over_rolls_its_batch_back(
    api: Api, tenant: Tenant, uploaded: dict
):
    from batches import idempotency
    from batches.requests import BatchSubmission
    from batches.services import _create_claimed

    claim = idempotency.key_acquire(org=tenant.org, key="fenced", digest="d")
    assert isinstance(claim, idempotency.KeyClaim)
    # Presumed dead: another request deleted our record and inserted its own.
    IdempotencyRecord.objects.filter(pk=claim.record_id).delete()
    IdempotencyRecord.objects.create(org=tenant.org, key="fenced", request_hash="d")
    submission_ = BatchSubmission(input_file_id=uploaded["id"])
    with pytest.raises(idempotency.ClaimLost):
        _create_claimed(org=tenant.org, submission=submission_, claim=claim)
    idempotency.key_done(claim=claim)
    assert Batch.objects.count() == 0
    assert not LedgerEntry.objects.filter(kind="hold").exists()


def test_abandoned_key_is_taken_over(api: Api, tenant: Tenant, uploaded: dict):
    from batches.idempotency import request_hash

    body = submission(uploaded["id"])
    record = IdempotencyRecord.objects.create(
        org=tenant.org, key="stale", request_hash=request_hash(body)
    )
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        created_at=record.created_at - dt.timedelta(hours=1)
    )
    assert api.post("/v1/batches", body, HTTP_IDEMPOTENCY_KEY="stale").status_code == 200


def test_keys_are_scoped_to_the_organization(
    api: Api, other_tenant: Tenant, uploaded: dict, catalog_model
):
    create(api, uploaded["id"], key="shared")
    theirs = other_tenant.api.upload(jsonl(request_line())).json()["id"]
    response = create(other_tenant.api, theirs, key="shared")
    assert response.status_code == 200
    assert Batch.objects.count() == 2


@pytest.mark.parametrize("key", [None, "", "k" * 257])
def test_missing_or_bad_idempotency_key_is_400(api: Api, uploaded: dict, key: str | None):
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    response = api.post("/v1/batches", submission(uploaded["id"]), **headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == (
        "missing_idempotency_key" if key is None else "invalid_idempotency_key"
    )
    if key is None:
        assert "extra_headers" in error["message"]
    assert Batch.objects.count() == 0


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (
            {"endpoint": "/v1/chat/completions", "completion_window": "24h"},
            "missing_required_parameter",
            "input_file_id",
        ),
        ({"endpoint": "/v1/embeddings"}, "invalid_endpoint", "endpoint"),
        ({"completion_window": "1h"}, "invalid_completion_window", "completion_window"),
        ({"surprise": 1}, "unknown_parameter", "surprise"),
        ({"metadata": {"team": "x"}}, "unsupported_metadata", "metadata.team"),
        ({"metadata": "x"}, "invalid_metadata", "metadata"),
    ],
)
def test_invalid_body_is_400_and_creates_nothing(
    api: Api, uploaded: dict, body: dict, code: str, param: str
):
    payload = {**submission(uploaded["id"]), **body}
    if code == "missing_required_parameter":
        payload = body
    response = api.post("/v1/batches", payload, HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 400
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == (code, param)
    assert response["x-should-retry"] == "false"
    assert Batch.objects.count() == 0
    assert not IdempotencyRecord.objects.exists()  # the refusal did not consume the key


def test_non_json_body_is_400(api: Api):
    response = api.client.post(
        "/v1/batches",
        "{nope",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api.key}",
        HTTP_IDEMPOTENCY_KEY="k",
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


def test_unknown_or_other_orgs_file_is_404(api: Api, other_tenant: Tenant, uploaded: dict):
    assert create(api, "file-nope").status_code == 404
    response = create(other_tenant.api, uploaded["id"])
    assert response.status_code == 404
    assert Batch.objects.count() == 0


def test_used_deleted_or_expired_input_is_400(api: Api, uploaded: dict, catalog_model):
    assert create(api, uploaded["id"], key="a").status_code == 200
    again = create(api, uploaded["id"], key="b")
    assert again.status_code == 400
    assert again.json()["error"]["code"] == "invalid_input_file_id"
    deleted = api.upload(jsonl(request_line())).json()["id"]
    api.delete(f"/v1/files/{deleted}")
    assert create(api, deleted, key="c").json()["error"]["code"] == "invalid_input_file_id"
    expired = api.upload(jsonl(request_line())).json()["id"]
    File.objects.filter(id=expired).update(expires_at=File.objects.get(id=expired).created_at)
    assert create(api, expired, key="d").json()["error"]["code"] == "invalid_input_file_id"
    assert Batch.objects.count() == 1


def test_insufficient_credit_is_402_and_holds_nothing(db, catalog_model):
    poor = make_tenant("poor", credit=1)
    file_id = poor.api.upload(jsonl(request_line())).json()["id"]
    response = create(poor.api, file_id)
    assert response.status_code == 402
    assert response.json()["error"]["code"] == "insufficient_credit"
    assert response["x-should-retry"] == "false"
    assert Batch.objects.count() == 0
    assert not LedgerEntry.objects.filter(kind="hold").exists()
    assert not IdempotencyRecord.objects.exists()


def test_fifth_unfinished_batch_is_429_and_key_is_not_consumed(api: Api, catalog_model):
    for i in range(4):
        file_id = api.upload(jsonl(request_line())).json()["id"]
        assert create(api, file_id, key=f"k{i}").status_code == 200
    file_id = api.upload(jsonl(request_line())).json()["id"]
    response = create(api, file_id, key="k4")
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "too_many_unfinished_batches"
    assert int(response["Retry-After"]) > 0
    assert response["x-should-retry"] == "true"
    assert Batch.objects.count() == 4
    Batch.objects.filter(status="in_progress").update(status="completed")
    assert create(api, file_id, key="k4").status_code == 200


def test_private_batch_over_95_items_is_429(api: Api, deployment):
    body = jsonl(
        *(
            request_line(f"t{i}", model=deployment.name, max_tokens=1, content="x")
            for i in range(96)
        )
    )
    file_id = api.upload(body).json()["id"]
    response = create(api, file_id)
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "private_batch_too_large"
    assert Batch.objects.count() == 0


def test_private_batch_bills_gpu_time(api: Api, deployment):
    file_id = api.upload(jsonl(request_line(model=deployment.name))).json()["id"]
    data = create(api, file_id).json()
    assert data["billing"] == "gpu_time"
    assert data["pricing"] is None
    assert LedgerEntry.objects.get(kind="hold", batch_id=data["id"]).amount_microusd > 0


def test_queue_backlog_is_429(api: Api, uploaded: dict, settings):
    settings.MAX_QUEUED_ITEMS = 1
    response = create(api, uploaded["id"])
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "queue_backlog_full"


def test_estimate_has_no_side_effects(api: Api, tenant: Tenant, uploaded: dict):
    response = api.post("/v1/batches/estimate", submission(uploaded["id"]))
    assert response.status_code == 200
    data = response.json()
    assert data["request_count"] == 2
    assert data["max_output_tokens"] == 16
    assert data["prompt_tokens"] > 0
    assert data["credit_sufficient"] is True
    assert int(data["max_charge_microusd"]) > 0
    assert Batch.objects.count() == 0
    assert not LedgerEntry.objects.filter(kind="hold").exists()
    read = api.post("/v1/batches/estimate", submission(uploaded["id"]), key=tenant.read_key)
    assert read.status_code == 200


def test_unloadable_revision_at_acceptance_is_503_and_creates_nothing(
    api: Api, uploaded: dict, tmp_path
):
    from inference import tokenization
    from inference.models import ModelRevision

    ModelRevision.objects.update(weights=str(tmp_path / "gone"))
    tokenization._cache.clear()
    response = create(api, uploaded["id"])
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "model_unavailable"
    assert Batch.objects.count() == 0
    assert not LedgerEntry.objects.filter(kind="hold").exists()
    assert not IdempotencyRecord.objects.exists()


def test_a_request_the_chat_template_refuses_is_a_400_naming_it_and_creates_nothing(
    api: Api, tenant: Tenant, catalog_model
):
    # A template that refuses some messages (GPT-OSS's does when a tool has no description;
    # this one refuses a word): counting the file at acceptance renders every request.
    revision = catalog_model.revision
    revision.chat_template = (
        "{% for m in messages %}{% if m.content == 'refuse me' %}"
        "{{ raise_exception('refused') }}{% endif %}{{ m.content }}{% endfor %}"
    )
    revision.save()
    upload = api.upload(jsonl(request_line("fine"), request_line("task-2", content="refuse me")))
    assert upload.status_code == 200, upload.content
    before = credit_for_org(org_id=tenant.org.id)
    response = create(api, upload.json()["id"])
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_input_file" and error["param"] == "input_file_id"
    assert "Request 2" in error["message"] and "'task-2'" in error["message"]
    assert "refuse me" not in error["message"]  # the content is never quoted
    assert not Batch.objects.exists() and not BatchItem.objects.exists()
    assert credit_for_org(org_id=tenant.org.id) == before
