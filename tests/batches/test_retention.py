"""Retention and the sweep command (docs/API.md "Limits, retention and privacy"): each kind removed
on time, counted, repeatable."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from batches.models import Batch, BatchItem
from batches.queue import EngineKey, items_claim
from batches.retention import STAGING_GRACE_SECONDS, retention_sweep
from boardwalk import clock
from files.models import File
from tests.batches.conftest import finalize, rows, run_worker, submit
from tests.conftest import Api, jsonl, postgres_only, request_line

pytestmark = pytest.mark.django_db


def sweep(*only: str) -> dict[str, Any]:
    out = io.StringIO()
    args = [arg for kind in only for arg in ("--only", kind)]
    call_command("sweep", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def blobs(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_each_kind_goes_on_time_and_a_second_pass_finds_nothing(
    api: Api, catalog_model: Any, tmp_path: Path
):
    content = tmp_path / "content"
    data = submit(api, rows(2))
    batch = Batch.objects.get(id=data["id"])
    run_worker(batch.id)
    assert BatchItem.objects.filter(batch=batch, result__isnull=False).count() == 2
    batch = finalize(batch.id)
    # Finalization shreds the input and drops the per-item results (copies of the output).
    assert File.objects.get(id=batch.input_file_id).status == "deleted"
    assert BatchItem.objects.filter(batch=batch, result__isnull=False).count() == 0
    output = File.objects.get(id=batch.output_file_id)
    assert output.recovery_name in blobs(content)
    unused = api.upload(jsonl(request_line())).json()["id"]

    assert sweep("retention")["retention"] == dict.fromkeys(
        [
            "unused_input",
            "accepted_input",
            "expired_results",
            "item_results",
            "leftover_blobs",
            "staged_blobs",
        ],
        0,
    )
    with clock.travel(dt.timedelta(hours=23, minutes=59)):
        assert sweep("retention")["retention"]["unused_input"] == 0
    with clock.travel(dt.timedelta(hours=24, minutes=1)):
        assert sweep("retention")["retention"]["unused_input"] == 1
        assert File.objects.get(id=unused).status == "deleted"
        assert sweep("retention")["retention"]["unused_input"] == 0
    with clock.travel(dt.timedelta(days=6, hours=23)):
        assert sweep("retention")["retention"]["expired_results"] == 0
    with clock.travel(dt.timedelta(days=7, minutes=1)):
        counts = sweep("retention")["retention"]
        # The output file only: no row failed, so there is no error file (error_file_id null).
        assert batch.error_file_id is None
        assert counts["expired_results"] == 1
        assert sweep("retention")["retention"]["expired_results"] == 0
    assert blobs(content) == []  # every copy of every file


def test_retention_finishes_what_a_crashed_finalizer_left(api: Api, catalog_model: Any):
    data = submit(api, rows(2))
    run_worker(data["id"])
    finalize(data["id"])
    batch = Batch.objects.get(id=data["id"])
    # As if the process died right after publishing: input and item results still there.
    File.objects.filter(id=batch.input_file_id).update(status="processed", wrapped_key=b"x" * 60)
    BatchItem.objects.filter(batch=batch).update(result=b"sealed")
    counts = sweep("retention")["retention"]
    assert counts["accepted_input"] == 1
    assert counts["item_results"] == 2
    assert sweep("retention")["retention"]["item_results"] == 0


def test_accepted_input_goes_48_hours_after_acceptance_at_the_latest(api: Api, catalog_model: Any):
    data = submit(api, rows(1))
    batch = Batch.objects.get(id=data["id"])
    with clock.travel(dt.timedelta(hours=47)):
        assert sweep("retention")["retention"]["accepted_input"] == 0
    with clock.travel(dt.timedelta(hours=48, minutes=1)):
        assert sweep("retention")["retention"]["accepted_input"] == 1
    assert File.objects.get(id=batch.input_file_id).wrapped_key is None


def test_staged_blobs_go_after_the_grace_period_by_the_injected_clock(db: None, tmp_path: Path):
    staging = tmp_path / "content" / ".incoming"
    staging.mkdir(parents=True)
    (staging / "blob-crashed").write_bytes(b"x")
    (staging / "not-ours").write_bytes(b"y")
    assert retention_sweep().staged_blobs == 0
    with clock.travel(dt.timedelta(seconds=STAGING_GRACE_SECONDS + 60)):
        assert retention_sweep().staged_blobs == 1
        assert retention_sweep().staged_blobs == 0
    assert os.listdir(staging) == ["not-ours"]


def test_sweep_leases_and_expiry_print_their_counts(api: Api, catalog_model: Any):
    data = submit(api, rows(2))
    batch = Batch.objects.get(id=data["id"])
    items_claim(key=EngineKey(batch.revision_id), worker_id="crashed", limit=1)
    assert sweep("leases")["leases"] == {"requeued": 0, "failed": 0, "holds_released": 0}
    with clock.travel(dt.timedelta(hours=1)):
        counts = sweep("leases")
        assert counts["leases"] == {"requeued": 1, "failed": 0, "holds_released": 0}
        assert set(counts) == {"leases", "wake"}  # nothing else ran
        assert counts["wake"]["engine_keys_with_work"] == 1
        assert sweep("expiry")["expiry"] == {"expired": 0}
    with clock.travel(dt.timedelta(hours=24, minutes=1)):
        assert sweep("expiry")["expiry"] == {"expired": 1}
        assert sweep("expiry")["expiry"] == {"expired": 0}
        assert sweep("finalize")["finalize"] == {"finalized": 1, "waiting": 0}
    assert Batch.objects.get(id=batch.id).status == "expired"


def test_sweep_prints_one_line_per_kind(db: None):
    out = io.StringIO()
    call_command("sweep", stdout=out)
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "leases",
        "expiry",
        "finalize",
        "retention",
        "wake",
    ]
    assert "unused_input=0" in lines[3]


def test_sweep_refuses_an_unknown_kind(db: None):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError):
        call_command("sweep", "--only", "everything")


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_concurrent_retention_sweeps_shred_each_file_once(api: Api, catalog_model: Any):
    ids = [api.upload(jsonl(request_line(f"t-{i}"))).json()["id"] for i in range(12)]
    results: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def run() -> None:
        try:
            start.wait()
            results.append(retention_sweep().unused_input)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    with clock.travel(dt.timedelta(hours=25)):
        threads = [threading.Thread(target=run) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    assert sum(results) == len(ids)  # each file counted by exactly one sweeper
    assert File.objects.filter(id__in=ids, status="deleted", stored_bytes=0).count() == len(ids)
