"""Work of stopped batches (cancelled, expired): it leaves the queue, and what is charged has
a receipt."""

from __future__ import annotations

import datetime as dt
import importlib
from typing import Any

import orjson
from django.apps import apps as django_apps
from django.test import Client

from batches.models import Batch, BatchItem
from batches.queue import EngineKey, item_finish, item_release, items_claim
from batches.sweeps import sweep_work
from boardwalk import clock
from console.selectors import queue_health
from tests.batches.conftest import finalize, rows, submit
from tests.batches.test_lifecycle import download, run_worker_items
from tests.conftest import Api


def _queue_depth() -> float:
    text = Client().get("/metrics").content.decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("boardwalk_queue_depth{")
    )


def _create(api: Api, n: int, key: str) -> Any:
    file_id = api.upload(b"".join(_line(r) for r in rows(n))).json()["id"]
    return api.post(
        "/v1/batches",
        {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        HTTP_IDEMPOTENCY_KEY=key,
    )


def _line(row: dict[str, Any]) -> bytes:
    return orjson.dumps(row) + b"\n"


def _cancel_after_one(api: Api, n: int, key: str) -> str:
    data = submit(api, rows(n), key=key)
    run_worker_items(EngineKey(Batch.objects.get(id=data["id"]).revision_id), 1)
    assert api.post(f"/v1/batches/{data['id']}/cancel").json()["status"] == "cancelling"
    return data["id"]


def test_a_cancelled_batchs_unrun_items_end_with_it_and_leave_the_queue(
    api: Api, catalog_model, settings
):
    batch_id = _cancel_after_one(api, 6, "c-1")
    # Cancelling: its items are no longer queued work, even before it is published.
    assert _queue_depth() == 0
    assert queue_health().pending_items == 0
    batch = finalize(batch_id)
    assert batch.status == "cancelled"
    items = BatchItem.objects.filter(batch_id=batch_id)
    assert not items.open().exists()
    ended = items.exclude(state=BatchItem.State.SUCCEEDED)
    assert ended.count() == 5
    assert set(ended.values_list("state", "error_code")) == {("failed", "batch_cancelled")}
    assert all(i.completed_at is not None for i in ended)
    assert [e["error"]["code"] for e in download(api, batch.error_file_id)] == [
        "batch_cancelled"
    ] * 5
    # The queue holds nothing, so a create that fits the limit is accepted (it was 429
    # `queue_backlog_full` while the cancelled rows stayed pending).
    assert _queue_depth() == 0
    assert queue_health().pending_items == 0
    assert sweep_work().to_wake == set()
    settings.MAX_QUEUED_ITEMS = 6
    response = _create(api, 6, "c-2")
    assert response.status_code == 200, response.content
    assert _queue_depth() == 6


def test_an_expired_batchs_unrun_items_end_with_it(api: Api, catalog_model, settings):
    data = submit(api, rows(4), key="e-1")
    run_worker_items(EngineKey(Batch.objects.get(id=data["id"]).revision_id), 1)
    with clock.travel(dt.timedelta(hours=24, seconds=1)):
        assert data["id"] in sweep_work().expired
        assert _queue_depth() == 0
        batch = finalize(data["id"])
        assert batch.status == "expired"
        items = BatchItem.objects.filter(batch_id=data["id"])
        assert set(items.exclude(state="succeeded").values_list("state", "error_code")) == {
            ("failed", "batch_expired")
        }
        assert items.filter(state="failed").count() == 3
        assert queue_health().pending_items == 0
        settings.MAX_QUEUED_ITEMS = 3
        response = _create(api, 3, "e-2")
    assert response.status_code == 200, response.content


def test_a_late_result_of_an_ended_item_is_fenced_off(api: Api, catalog_model):
    data = submit(api, rows(2), key="f-1")
    key = EngineKey(Batch.objects.get(id=data["id"]).revision_id)
    running = items_claim(key=key, worker_id="w-late", limit=1)[0]
    api.post(f"/v1/batches/{data['id']}/cancel")
    with clock.travel(dt.timedelta(minutes=1)):  # past the stopping grace
        batch = finalize(data["id"])
    assert batch.status == "cancelled" and batch.completed == 0 and batch.failed == 2
    assert not item_finish(item=running, worker_id="w-late", succeeded=True, result=b"x")
    assert BatchItem.objects.get(id=running.id).state == "failed"
    assert batch.charge_microusd == 0


def test_a_result_recorded_while_cancelling_is_published_and_charged(api: Api, catalog_model):
    """The decision (docs/API.md): a row whose result was recorded before the workers
    stopped is published and charged, as OpenAI publishes what completed during
    `cancelling`; only the rows still running when the batch is fenced are discarded."""
    data = submit(api, rows(3), key="p-1")
    key = EngineKey(Batch.objects.get(id=data["id"]).revision_id)
    running = items_claim(key=key, worker_id="w", limit=1)[0]
    api.post(f"/v1/batches/{data['id']}/cancel")
    assert item_finish(
        item=running,
        worker_id="w",
        succeeded=True,
        result=_sealed_result(running),
        prompt_tokens=5,
        completion_tokens=2,
    )
    batch = finalize(data["id"])
    assert batch.status == "cancelled"
    assert batch.completed == 1 and batch.failed == 2
    assert [r["custom_id"] for r in download(api, batch.output_file_id)] == [running.custom_id]
    assert batch.charge_microusd > 0
    receipts = api.get(f"/v1/requests?batch_id={batch.id}").json()["data"]
    assert [r["custom_id"] for r in receipts] == [running.custom_id]
    assert sum(int(r["charge_microusd"]) for r in receipts) == batch.charge_microusd


def _sealed_result(item: BatchItem) -> bytes:
    from files.crypto import Keyring
    from files.sealing import seal

    batch = item.batch
    data_key = Keyring.current().unwrap(batch.key_id, batch.wrapped_key)
    row = {"id": item.row_id, "custom_id": item.custom_id, "response": {}, "error": None}
    return seal(data_key, orjson.dumps(row), f"{batch.id}:{item.index}".encode())


def test_a_cancelled_deployment_batchs_receipts_add_up_to_its_charge(api: Api, deployment):
    data = submit(api, rows(3, model=deployment.name), key="d-1")
    key = EngineKey(Batch.objects.get(id=data["id"]).revision_id, deployment.id)
    run_worker_items(key, 1)
    aborted = items_claim(key=key, worker_id="w", limit=1)[0]
    api.post(f"/v1/batches/{data['id']}/cancel")
    assert item_release(item=aborted, worker_id="w", gpu_seconds=1.5)  # the engine stopped it
    batch = finalize(data["id"])
    assert batch.status == "cancelled" and batch.completed == 1
    receipts = api.get(f"/v1/requests?batch_id={batch.id}").json()["data"]
    assert sum(int(r["charge_microusd"]) for r in receipts) == batch.charge_microusd > 0
    by_item = {r["custom_id"]: r for r in receipts}
    stopped = by_item[aborted.custom_id]
    assert stopped["status_code"] is None and stopped["error_code"] == "batch_cancelled"
    assert int(stopped["charge_microusd"]) == 1_500_000 * deployment.gpu_second_price // 10**6
    published = [r for r in receipts if r["status_code"] == 200]
    assert len(published) == 1 and published[0]["error_code"] is None
    assert api.get(f"/v1/requests/{stopped['id']}").status_code == 200
    # The row never run (no GPU time, not published) has no receipt.
    assert len(receipts) == 2


def test_the_migration_ends_items_that_terminal_batches_left_open(api: Api, catalog_model):
    batch_id = _cancel_after_one(api, 3, "m-1")
    finalize(batch_id)
    # As the code before this change left them.
    BatchItem.objects.filter(batch_id=batch_id, state="failed").update(state="pending")
    live = submit(api, rows(2), key="m-2")
    migration = importlib.import_module(
        "batches.migrations.0007_end_open_items_of_terminal_batches"
    )
    migration.end_open_items(django_apps, None)
    assert not BatchItem.objects.filter(batch_id=batch_id).open().exists()
    assert set(
        BatchItem.objects.filter(batch_id=batch_id, state="failed").values_list("error_code")
    ) == {("batch_cancelled",)}
    # A running batch's items are left as they are.
    assert BatchItem.objects.filter(batch_id=live["id"], state="pending").count() == 2
