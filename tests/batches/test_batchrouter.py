"""BatchRouter assignment metadata on POST /v1/batches (docs/API.md "Batches")."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from batches.models import Batch, BatchItem, IdempotencyRecord
from batches.sweeps import sweep_work
from billing.models import LedgerEntry
from boardwalk import clock
from tests.batches.test_create import create
from tests.conftest import PRICES, Api, jsonl, request_line

pytestmark = pytest.mark.django_db


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _assert_refused(response: Any, code: str, param: str) -> None:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
    assert response["x-should-retry"] == "false"
    assert Batch.objects.count() == 0
    assert BatchItem.objects.count() == 0
    assert not LedgerEntry.objects.filter(kind="hold").exists()
    assert not IdempotencyRecord.objects.exists()  # the refusal did not consume the key


@pytest.mark.parametrize(
    ("metadata", "code", "param"),
    [
        ({"team": "x"}, "unsupported_metadata", "metadata.team"),
        ({"batchrouter_tier": "priority"}, "unsupported_metadata", "metadata.batchrouter_tier"),
        ({"batchrouter_role": "router"}, "unsupported_metadata", "metadata.batchrouter_role"),
        (
            {"batchrouter_input_format": "sectioned.v2"},
            "unsupported_metadata",
            "metadata.batchrouter_input_format",
        ),
        ({"batchrouter_work_unit_id": ""}, "invalid_metadata", "metadata.batchrouter_work_unit_id"),
        (
            {"batchrouter_work_unit_id": "é" * 65},  # 130 bytes of UTF-8
            "invalid_metadata",
            "metadata.batchrouter_work_unit_id",
        ),
        ({"batchrouter_work_unit_id": 7}, "invalid_metadata", "metadata.batchrouter_work_unit_id"),
        ({"batchrouter_deadline": "tomorrow"}, "invalid_metadata", "metadata.batchrouter_deadline"),
        (
            {"batchrouter_deadline": "2099-01-01T00:00:00"},  # no offset
            "invalid_metadata",
            "metadata.batchrouter_deadline",
        ),
        (
            {"batchrouter_deadline": "2099-13-01T00:00:00Z"},
            "invalid_metadata",
            "metadata.batchrouter_deadline",
        ),
        (
            {"batchrouter_deadline": "2020-01-01T00:00:00Z"},  # in the past
            "invalid_metadata",
            "metadata.batchrouter_deadline",
        ),
        (
            {"batchrouter_assignment_window": "0s"},
            "invalid_metadata",
            "metadata.batchrouter_assignment_window",
        ),
        (
            {"batchrouter_assignment_window": "2d"},
            "invalid_metadata",
            "metadata.batchrouter_assignment_window",
        ),
        (
            {"batchrouter_assignment_window": "-5m"},
            "invalid_metadata",
            "metadata.batchrouter_assignment_window",
        ),
        (
            {"batchrouter_assignment_window": "9" * 40 + "s"},
            "invalid_metadata",
            "metadata.batchrouter_assignment_window",
        ),
        (
            {"batchrouter_input_rate": "1.5"},
            "invalid_metadata",
            "metadata.batchrouter_input_rate",
        ),
        (
            {"batchrouter_output_rate": "0600000"},
            "invalid_metadata",
            "metadata.batchrouter_output_rate",
        ),
        (
            {"batchrouter_input_rate": str(PRICES[0] + 1)},
            "rate_mismatch",
            "metadata.batchrouter_input_rate",
        ),
        (
            {"batchrouter_cached_input_rate": "1"},
            "rate_mismatch",
            "metadata.batchrouter_cached_input_rate",
        ),
        (
            {"batchrouter_input_format": "sectioned.v1"},
            "input_format_mismatch",
            "metadata.batchrouter_input_format",
        ),
        ("x", "invalid_metadata", "metadata"),
    ],
)
def test_bad_assignment_metadata_is_400_and_creates_nothing(
    api: Api, uploaded: dict, metadata: Any, code: str, param: str
):
    _assert_refused(create(api, uploaded["id"], metadata=metadata), code, param)


def test_estimate_applies_the_same_rules(api: Api, uploaded: dict):
    body = {
        "input_file_id": uploaded["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "metadata": {"batchrouter_output_rate": "1"},
    }
    response = api.post("/v1/batches/estimate", body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "rate_mismatch"


def test_rates_are_refused_for_deployments(api: Api, deployment):
    file_id = api.upload(jsonl(request_line("a", model=deployment.name))).json()["id"]
    response = create(api, file_id, metadata={"batchrouter_input_rate": str(PRICES[0])})
    _assert_refused(response, "invalid_metadata", "metadata.batchrouter_input_rate")
    assert "GPU-second" in response.json()["error"]["message"]


def test_full_assignment_is_accepted_and_returned_as_sent(api: Api, uploaded: dict):
    metadata = {
        "batchrouter_work_unit_id": "wu-42",
        "batchrouter_deadline": _iso(clock.now() + dt.timedelta(hours=30)),
        "batchrouter_assignment_window": "36h",
        "batchrouter_tier": "standard",
        "batchrouter_role": "executor",
        "batchrouter_input_rate": str(PRICES[0]),
        "batchrouter_cached_input_rate": str(PRICES[1]),
        "batchrouter_output_rate": str(PRICES[2]),
    }
    response = create(api, uploaded["id"], metadata=metadata)
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["metadata"] == metadata
    assert api.get(f"/v1/batches/{data['id']}").json()["metadata"] == metadata
    # Neither the deadline (30 h) nor the window (36 h) beats the 24 h completion window.
    assert data["expires_at"] - data["created_at"] == 24 * 3600


@pytest.mark.parametrize(
    ("metadata", "winner"),
    [
        ({"batchrouter_assignment_window": "90s"}, "window"),
        ({"batchrouter_assignment_window": "45m"}, "window"),
        ({"batchrouter_assignment_window": "6h"}, "window"),
        ({"batchrouter_assignment_window": "25h"}, "24h"),
        ({"batchrouter_deadline": 2}, "deadline"),
        ({"batchrouter_deadline": 30}, "24h"),
        ({"batchrouter_deadline": 3, "batchrouter_assignment_window": "4h"}, "deadline"),
        ({"batchrouter_deadline": 3, "batchrouter_assignment_window": "2h"}, "window"),
    ],
)
def test_effective_deadline_is_the_earliest_and_becomes_expires_at(
    api: Api, uploaded: dict, metadata: dict[str, Any], winner: str
):
    deadline = None
    if "batchrouter_deadline" in metadata:
        hours = metadata["batchrouter_deadline"]
        deadline = clock.now().replace(microsecond=0) + dt.timedelta(hours=hours)
        metadata = {**metadata, "batchrouter_deadline": _iso(deadline)}
    response = create(api, uploaded["id"], metadata=metadata)
    assert response.status_code == 200, response.content
    data = response.json()
    if winner == "deadline":
        assert deadline is not None
        assert data["expires_at"] == int(deadline.timestamp())
    else:
        window = metadata.get("batchrouter_assignment_window", "24h")
        seconds = {"90s": 90, "45m": 2700, "6h": 6 * 3600, "2h": 7200}.get(window, 24 * 3600)
        # created_at is truncated to the second, expires_at is not rounded up: within 1 s.
        assert 0 <= data["expires_at"] - (data["created_at"] + seconds) <= 1
    batch = Batch.objects.get(id=data["id"])
    # Every item is scheduled (earliest deadline first) and expired by the same deadline.
    assert set(BatchItem.objects.filter(batch=batch).values_list("deadline", flat=True)) == {
        batch.expires_at
    }


def test_deadline_with_an_offset_is_read_in_that_offset(api: Api, uploaded: dict):
    local = (clock.now() + dt.timedelta(hours=2)).astimezone(dt.timezone(dt.timedelta(hours=-5)))
    deadline = local.replace(microsecond=0).isoformat()  # e.g. 2026-11-30T12:00:00-05:00
    response = create(api, uploaded["id"], metadata={"batchrouter_deadline": deadline})
    assert response.status_code == 200, response.content
    assert response.json()["expires_at"] == int(dt.datetime.fromisoformat(deadline).timestamp())


def test_batch_expires_at_its_assignment_window(api: Api, uploaded: dict):
    response = create(api, uploaded["id"], metadata={"batchrouter_assignment_window": "10m"})
    batch_id = response.json()["id"]
    with clock.travel(dt.timedelta(minutes=9)):
        assert batch_id not in sweep_work().expired
    with clock.travel(dt.timedelta(minutes=10, seconds=1)):
        assert batch_id in sweep_work().expired
    assert Batch.objects.get(id=batch_id).outcome == "expired"


def test_same_key_and_metadata_replays_the_batch(api: Api, uploaded: dict):
    metadata = {"batchrouter_work_unit_id": "wu-1", "batchrouter_assignment_window": "2h"}
    first = create(api, uploaded["id"], metadata=metadata)
    again = create(api, uploaded["id"], metadata=metadata)
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    changed = create(api, uploaded["id"], metadata={**metadata, "batchrouter_work_unit_id": "x"})
    assert changed.status_code == 409
    assert changed.json()["error"]["code"] == "idempotency_key_reused"
    assert Batch.objects.count() == 1
