"""A worker that owns fewer GPUs than a tensor-parallel revision spans leaves its work to
others (`BOARDWALK_WORKER_GPUS`, which `run_worker --devices` sets for each worker it starts):
its ranks would otherwise take GPUs another worker's engine runs on. Nothing is claimed,
failed or charged; the key is not asked for at its liveness beat; an interactive wake-up goes
back to the broker."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from batches.execution import pipeline, serve_wake
from batches.interactive.messages import request_channel
from batches.models import Batch, BatchItem
from batches.queue import EngineKey
from batches.tasks import join_waiting_work
from billing.models import LedgerEntry
from boardwalk.channels import channels
from inference.models import ModelRevision
from project.worker_supervisor import gpus_owned
from tests.batches.conftest import rows, submit
from tests.conftest import Api


@pytest.fixture
def wide(api: Api, catalog_model, settings, monkeypatch) -> tuple[str, EngineKey]:
    """A batch waiting on a revision spanning 2 GPUs, in a worker that owns 1."""
    data = submit(api, rows(3), key="wide-1")
    revision = Batch.objects.get(id=data["id"]).revision_id
    ModelRevision.objects.filter(id=revision).update(tensor_parallel_size=2)
    settings.WORKER_GPUS = 1
    monkeypatch.setattr(pipeline, "_left", set())
    monkeypatch.setattr(pipeline, "LEFT_WAKE_PAUSE_SECONDS", 0.0)
    return data["id"], EngineKey(revision)


def _serve(key: EngineKey, **options: Any) -> list[str]:
    woken: list[str] = []
    serve_wake(
        key,
        budget_seconds=30,
        wake=lambda: woken.append("batch"),
        finalize=lambda batch_id: woken.append("finalize"),
        finalize_later=lambda batch_id: woken.append("finalize later"),
        **options,
    )
    return woken


def test_its_batch_rows_are_left_untouched_and_said_once(wide, wakes, caplog) -> None:
    batch_id, key = wide
    with caplog.at_level(logging.WARNING, logger="batches.execution.pipeline"):
        assert _serve(key) == []
        assert _serve(key) == []

    statuses = set(BatchItem.objects.filter(batch_id=batch_id).values_list("state", flat=True))
    assert statuses == {"pending"}
    assert Batch.objects.get(id=batch_id).status == "in_progress"
    kinds = set(LedgerEntry.objects.filter(batch_id=batch_id).values_list("kind", flat=True))
    assert kinds == {"hold"}  # the acceptance's; nothing charged or released
    said = [r.getMessage() for r in caplog.records if "tensor-parallel" in r.getMessage()]
    assert len(said) == 1
    assert "runs tensor-parallel over 2 GPUs and this worker owns 1" in said[0]
    # Its liveness beat asks for nothing: the wake-up would reach only workers like it.
    assert join_waiting_work() == set()
    assert wakes == []


def test_a_worker_owning_enough_gpus_asks_for_it(wide, wakes, settings) -> None:
    _, key = wide
    settings.WORKER_GPUS = 2
    assert join_waiting_work() == {key}
    settings.WORKER_GPUS = 0  # the default: every visible GPU is the worker's
    assert join_waiting_work() == {key}


def test_an_interactive_wake_up_goes_back_to_the_broker(wide) -> None:
    _, key = wide
    channel = request_channel(key)
    channels().push(channel, b"waiting request", ttl=30)
    try:
        again: list[bool] = []
        assert _serve(key, wake_interactive=lambda: again.append(True)) == []
        assert again == [True]
        assert channels().length(channel) == 1  # not taken
    finally:
        channels().delete(channel)


@pytest.mark.parametrize(
    ("devices", "visible", "owned"),
    [
        (["cuda:0", "cuda:1", "cuda:2"], 3, {"cuda:0": 1, "cuda:1": 1, "cuda:2": 1}),
        (["cuda:0", "cuda:4"], 8, {"cuda:0": 4, "cuda:4": 4}),
        (["cuda:4", "cuda:0"], 8, {"cuda:4": 4, "cuda:0": 4}),  # in any order
        (["cuda:2"], 8, {"cuda:2": 6}),
        (["cuda", "cpu"], 2, {"cuda": 2}),  # a CPU worker owns no GPU
    ],
)
def test_each_supervised_worker_owns_the_gpus_up_to_the_next(devices, visible, owned) -> None:
    assert gpus_owned(devices, visible) == owned
