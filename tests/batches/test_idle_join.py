"""An idle worker process joins the work that waits: its liveness beat
asks for one wake-up per engine key with claimable items, and a busy process asks for none.
The two-process behaviour (both workers take part, a kill is taken over within seconds) is
the fault suite's `test_an_idle_worker_joins_waiting_work_and_takes_over_a_killed_one`."""

from __future__ import annotations

from batches.execution import serve_key
from batches.models import Batch
from batches.queue import EngineKey
from batches.tasks import join_waiting_work
from tests.batches.conftest import finalize, rows, submit
from tests.conftest import Api


def test_an_idle_process_asks_for_each_key_with_claimable_work(
    api: Api, catalog_model, deployment, wakes
):
    assert join_waiting_work() == set()
    assert wakes == []
    catalog = submit(api, rows(2), key="j-1")
    private = submit(api, rows(2, model=deployment.name), key="j-2")
    revision = Batch.objects.get(id=catalog["id"]).revision_id
    keys = join_waiting_work()
    assert keys == {EngineKey(revision), EngineKey(revision, deployment.id)}
    assert sorted(wakes) == sorted([(revision, ""), (revision, deployment.id)])
    # A cancelled batch's items are not waiting work.
    api.post(f"/v1/batches/{private['id']}/cancel")
    wakes.clear()
    assert join_waiting_work() == {EngineKey(revision)}
    assert wakes == [(revision, "")]


def test_a_process_running_an_engine_asks_for_nothing(api: Api, catalog_model, wakes):
    data = submit(api, rows(3), key="j-3")
    key = EngineKey(Batch.objects.get(id=data["id"]).revision_id)
    during: list[set[EngineKey]] = []
    # Mid-run (after its first claim, with two items still waiting) the process is busy.
    serve_key(key, max_items=1, on_more_work=lambda: during.append(join_waiting_work()))
    assert during == [set()]
    assert wakes == []
    serve_key(key)
    finalize(data["id"])
    assert join_waiting_work() == set()
    assert wakes == []
