"""The worker finalizes the batches its run finished itself (batches.execution.finalizer).

Nothing consumes the broker in these tests: a batch that ends terminal was finalized by the
run, not by a `finalize` message.
"""

from __future__ import annotations

import pytest

from batches.execution.finalizer import Finalizer
from batches.models import Batch
from batches.queue import EngineKey, items_claim
from batches.tasks import engine_wake
from tests.batches.conftest import finalize, rows, run_worker, submit
from tests.conftest import Api

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_run_that_records_a_batchs_last_result_publishes_it(api: Api, catalog_model) -> None:
    first, second = submit(api, rows(3), key="a"), submit(api, rows(2), key="b")
    engine_wake.fn(catalog_model.revision_id)  # the actor's body, in this thread
    for data, count in ((first, 3), (second, 2)):
        batch = Batch.objects.get(id=data["id"])
        assert batch.status == Batch.Status.COMPLETED
        assert batch.completed == count and batch.output_file_id is not None
        payload = api.get(f"/v1/batches/{data['id']}").json()
        assert payload["request_counts"] == {"total": count, "completed": count, "failed": 0}


def test_a_wake_up_whose_work_was_taken_costs_one_query(
    api: Api, catalog_model, monkeypatch
) -> None:
    """A run sends a wake-up per full claim group, for idle workers; most find the run has
    claimed everything. Each costs one existence query: no finalizer thread, no second
    query for work left over."""
    import threading

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    data = submit(api, rows(2))
    engine_wake.fn(catalog_model.revision_id)
    assert Batch.objects.get(id=data["id"]).status == Batch.Status.COMPLETED
    started: list[str] = []
    start = threading.Thread.start

    def watched(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", watched)
    with CaptureQueriesContext(connection) as captured:
        engine_wake.fn(catalog_model.revision_id)
    assert len(captured.captured_queries) == 1
    assert started == []


def test_a_batch_not_ready_yet_is_handed_on_and_left_as_it_is(api: Api, catalog_model) -> None:
    data = submit(api, rows(2))
    batch = Batch.objects.get(id=data["id"])
    items_claim(key=EngineKey(batch.revision_id), worker_id="w-busy", limit=1)  # a live lease
    assert api.post(f"/v1/batches/{data['id']}/cancel").json()["status"] == "cancelling"
    later: list[str] = []
    failed: list[str] = []
    finalizer = Finalizer(not_ready=later.append, failed=failed.append)
    finalizer.submit(data["id"])
    finalizer.submit(data["id"])  # once per finalizer
    finalizer.close()
    assert later == [data["id"]] and failed == []
    assert Batch.objects.get(id=data["id"]).status == Batch.Status.CANCELLING


def test_a_finalization_that_raises_is_handed_on_and_publishes_nothing(
    api: Api, catalog_model
) -> None:
    data = submit(api, rows(2))
    assert run_worker(data["id"]) == {data["id"]}  # every item recorded, nothing finalized
    key_id = Batch.objects.get(id=data["id"]).key_id
    Batch.objects.filter(id=data["id"]).update(key_id="k-unknown")  # its key cannot unwrap
    later: list[str] = []
    failed: list[str] = []
    finalizer = Finalizer(not_ready=later.append, failed=failed.append)
    finalizer.submit(data["id"])
    finalizer.close()
    assert failed == [data["id"]] and later == []
    batch = Batch.objects.get(id=data["id"])
    assert batch.status == Batch.Status.FINALIZING and batch.output_file_id is None
    # What the finalize actor then does, once the cause is gone: nothing was lost.
    Batch.objects.filter(id=data["id"]).update(key_id=key_id)
    assert finalize(data["id"]).status == Batch.Status.COMPLETED


def test_a_broker_that_cannot_take_the_hand_off_costs_a_log_line_not_the_next_batch(
    api: Api, catalog_model, caplog: pytest.LogCaptureFixture
) -> None:
    stuck, ready = submit(api, rows(2), key="stuck"), submit(api, rows(1), key="ready")
    stuck_batch = Batch.objects.get(id=stuck["id"])
    items_claim(key=EngineKey(stuck_batch.revision_id), worker_id="w-busy", limit=1)
    assert api.post(f"/v1/batches/{stuck['id']}/cancel").json()["status"] == "cancelling"
    assert run_worker(ready["id"]) == {ready["id"]}

    def unreachable(batch_id: str) -> None:
        raise ConnectionError("broker down")

    finalizer = Finalizer(not_ready=unreachable, failed=unreachable)
    finalizer.submit(stuck["id"])
    finalizer.submit(ready["id"])
    finalizer.close()
    assert f"finalize of {stuck['id']} not enqueued: ConnectionError" in caplog.text
    assert Batch.objects.get(id=stuck["id"]).status == Batch.Status.CANCELLING  # the sweeper's
    assert Batch.objects.get(id=ready["id"]).status == Batch.Status.COMPLETED
