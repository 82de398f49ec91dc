from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from batches.lifecycle import batch_finalize
from tests.batches.conftest import rows, submit
from tests.conftest import Api
from tests.webhooks.receiver import Receiver
from webhooks.delivery import deliveries_due, delivery_attempt


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    """A started local receiver, reachable because BOARDWALK_OUTBOUND_ALLOW names it."""
    recv = Receiver().start()
    settings.OUTBOUND_ALLOW = [recv.target]
    yield recv
    recv.stop()


ALL_TYPES = ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]


def register(api: Api, url: str, **extra: Any) -> dict[str, Any]:
    body = {"name": "hook", "url": url, "event_types": ALL_TYPES, **extra}
    response = api.post("/v1/webhook_endpoints", body)
    assert response.status_code == 200, response.content
    return response.json()


def cancelled_batch(api: Api, key: str = "run-1") -> str:
    """A batch made terminal (cancelled) without running the engine."""
    data = submit(api, rows(2), key=key)
    assert api.post(f"/v1/batches/{data['id']}/cancel").status_code == 200
    batch = batch_finalize(batch_id=data["id"])
    assert batch is not None and batch.status == "cancelled"
    return data["id"]


def deliver_due() -> list[str | None]:
    """What the sweep plus the actor do, in the test thread."""
    return [delivery_attempt(delivery_id=i) for i in deliveries_due()]
