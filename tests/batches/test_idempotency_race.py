"""Racing identical creates under one Idempotency-Key make one batch (docs/API.md "Batches")."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from batches.models import Batch, IdempotencyRecord
from billing.models import LedgerEntry
from tests.conftest import Api, jsonl, postgres_only, request_line


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_twenty_identical_racing_requests_make_one_batch_and_one_hold(api: Api, catalog_model):
    file_id = api.upload(jsonl(request_line("a"), request_line("b"))).json()["id"]
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    start = threading.Barrier(20)
    results: list[Any] = []

    def create() -> None:
        try:
            client = Api(APIClient(), api.key)
            start.wait()
            response = client.post("/v1/batches", body, HTTP_IDEMPOTENCY_KEY="race")
            results.append((response.status_code, response.json().get("id")))
        finally:
            connection.close()

    threads = [threading.Thread(target=create) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 20
    assert {status for status, _ in results} == {200}
    assert len({batch_id for _, batch_id in results}) == 1
    assert Batch.objects.count() == 1
    assert LedgerEntry.objects.filter(kind="hold").count() == 1
    assert IdempotencyRecord.objects.count() == 1
