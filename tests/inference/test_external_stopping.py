"""A stopping batch's rows on an external engine end, even those that had not reached it yet.

Found by the fault suite (tests/faults/test_external_faults.py, upstream down past the
deadline): when a batch expired while its upstream held requests unanswered, the rows still
waiting in the run's queue for room in the engine were counted as aborted before they were
in it, then added and sent anyway; and an abort right behind a row's `add` cancelled its task
before it ran, so the row was never answered. The run then waited on them, its worker thread
with it, and the expired batch was never finalized.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from batches.execution.pipeline import serve_key
from batches.models import Batch, BatchItem
from batches.queue import EngineKey
from batches.sweeps import sweep_work
from boardwalk import clock
from inference.runtime import engine_drop
from tests.batches.conftest import rows, submit
from tests.conftest import Api
from tests.inference import test_external_engine, test_external_model_command
from tests.inference.test_external_engine import results_of, row, wait_for
from tests.inference.test_external_model_command import external
from tests.inference.test_model_command import model
from tests.inference.upstreams import FaultProxy, hold

# The served tiny model, its directory without weights, and engines on it, as the other
# external-engine tests use them.
served = test_external_engine.served
tokenizer = test_external_engine.tokenizer
proxy = test_external_engine.proxy
engine_of = test_external_engine.engine_of
tokenizer_dir = test_external_model_command.tokenizer_dir


def test_an_abort_right_behind_its_add_ends_the_row_aborted(proxy, engine_of):
    engine = engine_of(proxy)
    gate = threading.Event()
    engine._loop.call_soon_threadsafe(gate.wait, 10)  # both verbs reach the loop together
    engine.add(row(1))
    engine.abort(["row-1"])
    gate.set()
    [result] = results_of(engine, 1).values()
    assert result.aborted and result.error is None
    assert proxy.posts() == []  # never sent


@pytest.mark.django_db(transaction=True)
def test_an_expired_batch_stops_the_rows_waiting_to_enter_the_engine(
    served, tokenizer_dir, api: Api, catalog_model
):
    """Its upstream answers nothing; the batch expires with rows at the upstream, rows waiting
    for a slot and rows queued for the engine: every one is stopped, every request the
    upstream got has its connection closed, and the run ends."""
    with FaultProxy(served.url.removesuffix("/v1")) as down:
        args = external(served, tokenizer_dir, "--max-in-flight", "4", url=down.url)
        revision = model("set-revision", catalog_model.name, *args)["revision"]["id"]
        batch = submit(api, rows(24, max_tokens=2), key="stopping")
        down.plan(*[hold() for _ in range(24)])

        def serving() -> None:  # as a worker's thread does: its connection closed after
            try:
                serve_key(EngineKey(revision), threaded=True)
            finally:
                connection.close()

        run = threading.Thread(target=serving)
        run.start()
        try:
            wait_for(lambda: down.in_flight == 4)  # the revision's limit is at the upstream
            # and more rows claimed than the engine takes (its credit: twice the limit): some
            # wait in the run's queue for room in it.
            claimed = BatchItem.objects.filter(state=BatchItem.State.RUNNING)
            wait_for(lambda: claimed.count() > 2 * 4)
            expires = clock.now()
            Batch.objects.filter(id=batch["id"]).update(expires_at=expires)
            BatchItem.objects.filter(batch_id=batch["id"]).update(deadline=expires)
            assert batch["id"] in sweep_work().expired
            run.join(timeout=test_external_engine.WAIT_SECONDS)
            assert not run.is_alive(), "the run still waits on rows of the expired batch"
            wait_for(lambda: len(down.closed_by_client) == len(down.posts()))
        finally:
            down.close()  # whatever it still holds ends, so a failed run ends too
            run.join()
            engine_drop(revision)  # its loop thread and connections end with the test
