"""From acceptance to a terminal state, driven in the test thread
(docs/API.md "Batches", "Result files", "Billing")."""

from __future__ import annotations

import datetime as dt

import orjson
import pytest

from batches.execution import serve_key
from batches.lifecycle import ITEM_ERROR_MESSAGES, NotReady
from batches.models import Batch, BatchItem
from batches.queue import EngineKey, item_finish, items_claim, leases_recover
from batches.sweeps import sweep_work
from billing.metering import gpu_microseconds_by_item
from billing.models import LedgerEntry, UsageEvent
from billing.pricing import TokenPrices, money_div, token_charge
from billing.selectors import credit_for_org
from boardwalk import clock
from boardwalk.codes import ItemCode
from files.models import File
from inference.rendering import render_prompt
from inference.runtime import tokenizer_for
from tests.batches.conftest import finalize, rows, run_worker, submit
from tests.conftest import PRICES, Api, Tenant, content_of, jsonl, parse_jsonl, request_line

pytestmark = pytest.mark.django_db


def download(api: Api, file_id: str | None) -> list[dict]:
    assert file_id is not None
    response = api.get(f"/v1/files/{file_id}/content")
    assert response.status_code == 200
    return parse_jsonl(content_of(response))


def test_batch_runs_publishes_and_charges_exactly_the_published_rows(
    api: Api, tenant: Tenant, catalog_model
):
    inputs = rows(6)
    data = submit(api, inputs)
    assert run_worker(data["id"]) == {data["id"]}
    batch = finalize(data["id"])
    assert batch.status == "completed"
    payload = api.get(f"/v1/batches/{data['id']}").json()
    assert payload["status"] == "completed"
    assert payload["completed_at"] is not None
    assert payload["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
    output = download(api, payload["output_file_id"])
    assert payload["error_file_id"] is None  # nothing failed: no error file, as in OpenAI
    assert [r["custom_id"] for r in output] == [r["custom_id"] for r in inputs]
    tokenizer = tokenizer_for(catalog_model.revision)
    expected_charge = 0
    prices = TokenPrices(*PRICES)
    for row, line in zip(output, inputs, strict=True):
        assert row["id"].startswith("batch_req_")
        assert row["error"] is None
        response = row["response"]
        assert response["status_code"] == 200
        body = response["body"]
        assert body["object"] == "chat.completion"
        assert body["model"] == "boardwalk/tiny-chat"
        assert body["system_fingerprint"] == payload["model_config_id"]
        usage = body["usage"]
        assert usage["prompt_tokens"] == len(render_prompt(tokenizer, line["body"]["messages"]))
        assert 1 <= usage["completion_tokens"] <= 8
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        choice = body["choices"][0]
        assert choice["finish_reason"] in ("stop", "length")
        assert choice["message"]["role"] == "assistant"
        expected_charge += token_charge(
            prices, prompt=usage["prompt_tokens"], cached=0, completion=usage["completion_tokens"]
        )
        receipt = api.get(f"/v1/requests/{response['request_id']}").json()
        assert receipt["custom_id"] == row["custom_id"]
        assert receipt["usage"]["prompt_tokens"] == usage["prompt_tokens"]
        assert "choices" not in orjson.dumps(receipt).decode()
    assert payload["charge_microusd"] == str(expected_charge)
    credit = credit_for_org(org_id=tenant.org.id)
    assert credit.held == 0
    assert (
        LedgerEntry.objects.get(kind="charge", batch_id=data["id"]).amount_microusd
        == expected_charge
    )
    # Accepted input is removed once the batch is terminal.
    assert File.objects.get(id=data["input_file_id"]).status == "deleted"


def test_finalize_twice_publishes_once_and_charges_once(api: Api, catalog_model):
    data = submit(api, rows(3))
    run_worker(data["id"])
    first = finalize(data["id"])
    second = finalize(data["id"])
    assert (first.output_file_id, first.error_file_id) == (
        second.output_file_id,
        second.error_file_id,
    )
    assert LedgerEntry.objects.filter(batch_id=data["id"], kind="charge").count() == 1
    assert LedgerEntry.objects.filter(batch_id=data["id"], kind="release").count() == 1
    etag = api.get(f"/v1/files/{first.output_file_id}/content")["ETag"]
    assert api.get(f"/v1/files/{first.output_file_id}/content")["ETag"] == etag


def test_crash_between_publishing_files_and_the_batch_row_resumes(
    api: Api, catalog_model, monkeypatch
):
    data = submit(api, rows(2))
    run_worker(data["id"])

    def boom(**kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr("batches.lifecycle.credit_settle", boom)
    with pytest.raises(RuntimeError):
        finalize(data["id"])
    assert Batch.objects.get(id=data["id"]).status == "finalizing"
    monkeypatch.undo()
    batch = finalize(data["id"])
    assert batch.status == "completed"
    assert batch.error_file_id is None  # nothing failed: only the output file exists
    assert File.objects.filter(purpose="batch_output").count() == 1
    assert len(download(api, batch.output_file_id)) == 2
    assert LedgerEntry.objects.filter(batch_id=data["id"], kind="charge").count() == 1


def test_cancel_before_any_work_writes_cancelled_rows_and_charges_nothing(
    api: Api, tenant: Tenant, catalog_model
):
    data = submit(api, rows(3))
    response = api.post(f"/v1/batches/{data['id']}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelling"
    assert run_worker(data["id"]) == set()  # nothing is claimed from a cancelling batch
    batch = finalize(data["id"])
    assert batch.status == "cancelled"
    payload = api.get(f"/v1/batches/{data['id']}").json()
    assert payload["cancelled_at"] is not None and payload["completed_at"] is None
    assert download(api, payload["output_file_id"]) == []
    errors = download(api, payload["error_file_id"])
    assert [e["error"]["code"] for e in errors] == ["batch_cancelled"] * 3
    assert payload["charge_microusd"] == "0"
    assert credit_for_org(org_id=tenant.org.id).held == 0
    again = api.post(f"/v1/batches/{data['id']}/cancel")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "batch_not_cancellable"


def test_cancel_midway_publishes_finished_results(api: Api, catalog_model):
    data = submit(api, rows(4))
    batch = Batch.objects.get(id=data["id"])
    key = EngineKey(batch.revision_id)
    # Two items finish, one is running (leased) when the cancel arrives, one never starts.
    run_worker_items(key, 2)
    running = items_claim(key=key, worker_id="w-late", limit=1)[0]
    assert api.post(f"/v1/batches/{data['id']}/cancel").json()["status"] == "cancelling"
    assert api.post(f"/v1/batches/{data['id']}/cancel").json()["status"] == "cancelling"
    with pytest.raises(NotReady):
        finalize(data["id"])  # the running item gets a grace period to stop
    with clock.travel(dt.timedelta(minutes=1)):
        batch = finalize(data["id"])
    assert batch.status == "cancelled"
    # The late worker's result is fenced off.
    assert not item_finish(item=running, worker_id="w-late", succeeded=True, result=b"x")
    output = download(api, batch.output_file_id)
    errors = download(api, batch.error_file_id)
    assert len(output) == 2
    assert [e["error"]["code"] for e in errors] == ["batch_cancelled"] * 2
    assert {r["custom_id"] for r in output} | {e["custom_id"] for e in errors} == {
        f"task-{i}" for i in range(4)
    }
    assert batch.completed == 2 and batch.failed == 2
    assert batch.charge_microusd > 0


def run_worker_items(key: EngineKey, count: int) -> None:
    """Run exactly `count` items through the real worker path."""
    serve_key(key, max_items=count)


def test_expiry_publishes_what_finished_and_expires_the_rest(api: Api, catalog_model):
    data = submit(api, rows(3))
    batch = Batch.objects.get(id=data["id"])
    run_worker_items(EngineKey(batch.revision_id), 1)
    with clock.travel(dt.timedelta(hours=24, seconds=1)):
        report = sweep_work()
        assert data["id"] in report.expired
        assert data["id"] in report.to_finalize
        assert run_worker(data["id"]) == set()  # past the deadline nothing is claimed
        batch = finalize(data["id"])
    assert batch.status == "expired"
    payload = api.get(f"/v1/batches/{data['id']}").json()
    assert payload["expired_at"] is not None
    assert len(download(api, payload["output_file_id"])) == 1
    assert [e["error"]["code"] for e in download(api, payload["error_file_id"])] == [
        "batch_expired"
    ] * 2


def test_context_length_exceeded_is_an_item_error_not_charged(api: Api, catalog_model):
    limit = catalog_model.revision.context_length
    long_prompt = "word " * limit
    data = submit(
        api, [request_line("ok"), request_line("too-long", content=long_prompt, max_tokens=8)]
    )
    run_worker(data["id"])
    batch = finalize(data["id"])
    assert batch.status == "completed"
    assert [r["custom_id"] for r in download(api, batch.output_file_id)] == ["ok"]
    errors = download(api, batch.error_file_id)
    assert errors[0]["custom_id"] == "too-long"
    assert errors[0]["error"]["code"] == "context_length_exceeded"
    assert errors[0]["response"] is None
    assert batch.failed == 1


def test_rows_beyond_the_output_limit_become_uncharged_errors(api: Api, catalog_model, monkeypatch):
    data = submit(api, rows(3))
    run_worker(data["id"])
    first_row = len(BatchItem.objects.get(batch_id=data["id"], index=0).result)
    monkeypatch.setattr("batches.lifecycle.MAX_RESULT_FILE_BYTES", first_row + 10)
    batch = finalize(data["id"])
    output = download(api, batch.output_file_id)
    errors = download(api, batch.error_file_id)
    assert len(output) == 1
    assert [e["error"]["code"] for e in errors] == ["output_limit_exceeded"] * 2
    charged = BatchItem.objects.filter(batch_id=data["id"], charge_microusd__gt=0).count()
    assert charged == 1
    assert batch.completed == 1 and batch.failed == 2


def test_abandoned_lease_is_recovered_and_the_stale_worker_is_fenced(api: Api, catalog_model):
    data = submit(api, rows(1))
    batch = Batch.objects.get(id=data["id"])
    key = EngineKey(batch.revision_id)
    stale = items_claim(key=key, worker_id="crashed", limit=1)[0]
    with clock.travel(dt.timedelta(hours=1)):
        assert leases_recover() == (1, 0)
    run_worker(data["id"])
    assert not item_finish(item=stale, worker_id="crashed", succeeded=True, result=b"stale")
    batch = finalize(data["id"])
    assert len(download(api, batch.output_file_id)) == 1
    item = BatchItem.objects.get(batch_id=data["id"])
    assert item.attempts == 2


def test_item_out_of_attempts_fails_with_internal_error(api: Api, catalog_model, settings):
    settings.ITEM_MAX_ATTEMPTS = 1
    data = submit(api, rows(1))
    batch = Batch.objects.get(id=data["id"])
    items_claim(key=EngineKey(batch.revision_id), worker_id="crashed", limit=1)
    with clock.travel(dt.timedelta(hours=1)):
        assert leases_recover() == (0, 1)
    batch = finalize(data["id"])
    assert batch.status == "completed"
    assert download(api, batch.error_file_id)[0]["error"]["code"] == "internal_error"


def test_revision_that_cannot_load_fails_the_batch(api: Api, catalog_model, tmp_path):
    data = submit(api, rows(2))
    from inference.models import ModelRevision

    ModelRevision.objects.filter(id=data["model_config_id"]).update(
        weights=str(tmp_path / "missing")
    )
    from inference import runtime

    runtime._engines.clear()
    assert run_worker(data["id"]) == {data["id"]}
    batch = finalize(data["id"])
    assert batch.status == "failed"
    payload = api.get(f"/v1/batches/{data['id']}").json()
    assert payload["failed_at"] is not None
    assert payload["errors"]["data"][0]["code"] == "model_load_failed"
    assert [e["error"]["code"] for e in download(api, payload["error_file_id"])] == [
        "batch_failed"
    ] * 2


def test_list_batches_newest_first_with_cursor(api: Api, catalog_model):
    ids = [submit(api, rows(1), key=f"k{i}")["id"] for i in range(3)]
    page = api.get("/v1/batches?limit=2").json()
    assert [b["id"] for b in page["data"]] == ids[::-1][:2]
    assert page["has_more"] is True
    assert page["first_id"] == ids[2] and page["last_id"] == ids[1]
    rest = api.get(f"/v1/batches?limit=2&after={page['last_id']}").json()
    assert [b["id"] for b in rest["data"]] == [ids[0]]
    assert rest["has_more"] is False
    assert api.get("/v1/batches?limit=0").status_code == 400
    assert api.get("/v1/batches?limit=101").status_code == 400


def test_other_orgs_batch_is_404(api: Api, other_tenant: Tenant, catalog_model):
    data = submit(api, rows(1))
    assert other_tenant.api.get(f"/v1/batches/{data['id']}").status_code == 404
    assert other_tenant.api.post(f"/v1/batches/{data['id']}/cancel").status_code == 404
    assert other_tenant.api.get("/v1/batches").json()["data"] == []
    assert Batch.objects.get(id=data["id"]).status == "in_progress"


def test_input_file_of_unfinished_batch_cannot_be_deleted(api: Api, catalog_model):
    data = submit(api, rows(1))
    response = api.delete(f"/v1/files/{data['input_file_id']}")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "file_in_use"
    assert File.objects.get(id=data["input_file_id"]).status == "processed"


def test_deployment_batch_is_charged_gpu_time_not_tokens(api: Api, tenant: Tenant, deployment):
    data = submit(api, rows(3, model=deployment.name))
    run_worker(data["id"])
    batch = finalize(data["id"])
    assert batch.status == "completed"
    items = list(BatchItem.objects.filter(batch_id=data["id"]))
    used = gpu_microseconds_by_item(batch_id=data["id"])
    assert set(used) == {i.id for i in items} and all(us > 0 for us in used.values())
    price = deployment.gpu_second_price
    assert batch.charge_microusd == sum(money_div(us * price, 1_000_000) for us in used.values())
    assert {i.id: i.charge_microusd for i in items} == {
        i: money_div(us * price, 1_000_000) for i, us in used.items()
    }
    payload = api.get(f"/v1/batches/{data['id']}").json()
    assert payload["billing"] == "gpu_time" and payload["pricing"] is None
    assert credit_for_org(org_id=tenant.org.id).held == 0


def test_gpu_time_spent_before_a_cancel_is_charged(api: Api, deployment):
    from batches.queue import item_release

    data = submit(api, rows(2, model=deployment.name))
    batch = Batch.objects.get(id=data["id"])
    item = items_claim(key=EngineKey(batch.revision_id, deployment.id), worker_id="w", limit=1)[0]
    api.post(f"/v1/batches/{data['id']}/cancel")
    item_release(item=item, worker_id="w", gpu_seconds=2.5)  # the engine aborted it
    batch = finalize(data["id"])
    assert batch.status == "cancelled"
    assert batch.charge_microusd == 2_500_000 * deployment.gpu_second_price // 1_000_000
    assert UsageEvent.objects.get(item_id=item.id).quantity == 2_500_000
    assert (
        LedgerEntry.objects.get(batch_id=batch.id, kind="charge").amount_microusd
        == batch.charge_microusd
    )


def test_receipts_list_by_batch_with_cursor(api: Api, other_tenant: Tenant, catalog_model):
    data = submit(api, rows(3))
    run_worker(data["id"])
    finalize(data["id"])
    page = api.get(f"/v1/requests?batch_id={data['id']}&limit=2").json()
    assert page["object"] == "list" and len(page["data"]) == 2 and page["has_more"] is True
    rest = api.get(f"/v1/requests?batch_id={data['id']}&limit=2&after={page['last_id']}").json()
    ids = [r["id"] for r in page["data"] + rest["data"]]
    assert len(set(ids)) == 3
    assert all(
        r["object"] == "request.receipt" and r["batch_id"] == data["id"] for r in page["data"]
    )
    assert other_tenant.api.get(f"/v1/requests/{ids[0]}").status_code == 404
    assert other_tenant.api.get("/v1/requests").json()["data"] == []


def test_retention_shreds_results_after_seven_days_and_unused_input_after_a_day(
    api: Api, catalog_model
):
    data = submit(api, rows(1))
    run_worker(data["id"])
    batch = finalize(data["id"])
    unused = api.upload(jsonl(request_line())).json()["id"]
    with clock.travel(dt.timedelta(hours=25)):
        sweep_work()
        assert File.objects.get(id=unused).status == "deleted"
        assert File.objects.get(id=batch.output_file_id).status == "processed"
    with clock.travel(dt.timedelta(days=7, minutes=1)):
        sweep_work()
        assert File.objects.get(id=batch.output_file_id).status == "deleted"
        assert api.get(f"/v1/files/{batch.output_file_id}/content").status_code == 404


def test_cancel_while_finalizing_returns_the_batch_unchanged(api: Api, catalog_model):
    data = submit(api, rows(1))
    run_worker(data["id"])
    Batch.objects.filter(id=data["id"]).update(status="finalizing", outcome="completed")
    response = api.post(f"/v1/batches/{data['id']}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "finalizing"
    assert finalize(data["id"]).status == "completed"


def test_finalizing_never_sticks_when_the_finalize_message_is_lost(api: Api, catalog_model):
    data = submit(api, rows(2))
    run_worker(data["id"])  # its finalize message is never sent in this test
    report = sweep_work()
    assert data["id"] in report.to_finalize
    assert Batch.objects.get(id=data["id"]).status == "finalizing"
    assert finalize(data["id"]).status == "completed"


def test_retention_removes_blobs_a_crashed_upload_left_staged(db, tmp_path):
    import os
    import time

    from batches.retention import STAGING_GRACE_SECONDS, retention_sweep

    staging = tmp_path / "content" / ".incoming"
    staging.mkdir(parents=True)
    stale, fresh = staging / "blob-stale", staging / "blob-fresh"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"y")
    old = time.time() - STAGING_GRACE_SECONDS - 60
    os.utime(stale, (old, old))
    retention_sweep()
    assert not stale.exists()
    assert fresh.exists()


def test_content_never_reaches_logs_rows_or_receipts(api: Api, catalog_model, caplog):
    import logging

    marker = "CONFIDENTIAL-PROMPT-5d1e"
    caplog.set_level(logging.DEBUG)
    bad = api.upload(jsonl(request_line("bad", content=marker, max_tokens=0)))
    assert bad.status_code == 400
    data = submit(api, [request_line("a", content=marker), request_line("b", content=marker)])
    run_worker(data["id"])
    batch = finalize(data["id"])
    receipts = api.get(f"/v1/requests?batch_id={batch.id}").content.decode()
    assert marker not in caplog.text
    assert marker not in receipts
    assert marker not in bad.content.decode()
    for item in BatchItem.objects.filter(batch=batch):
        assert marker.encode() not in bytes(item.result or b"")
    for entry in LedgerEntry.objects.all():
        assert marker not in entry.memo


def test_every_item_code_has_a_message_an_error_file_row_can_show() -> None:
    """An error row carries a sentence saying what happened and what to do, never the bare code."""
    assert sorted(set(ItemCode) - set(ITEM_ERROR_MESSAGES)) == []
    assert all(len(message.split()) >= 5 for message in ITEM_ERROR_MESSAGES.values())
