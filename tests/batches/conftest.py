from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from batches.execution import serve_key
from batches.lifecycle import batch_finalize
from batches.models import Batch
from batches.queue import EngineKey
from batches.tasks import engine_wake
from project.worker_runtime import WorkerRuntime
from tests.conftest import Api, jsonl, request_line


@pytest.fixture(autouse=True)
def _long_leases(settings: Any) -> None:
    # Synchronous tests run the worker in the test's own transaction: keep the heartbeat
    # thread asleep so it never competes for the SQLite write lock.
    settings.ITEM_LEASE_SECONDS = 900


def submit(api: Api, rows: list[dict[str, Any]], key: str = "run-1") -> dict[str, Any]:
    file_id = api.upload(jsonl(*rows)).json()["id"]
    response = api.post(
        "/v1/batches",
        {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        HTTP_IDEMPOTENCY_KEY=key,
    )
    assert response.status_code == 200, response.content
    return response.json()


def run_worker(batch_id: str) -> set[str]:
    """What the engine_wake actor does, in the test thread."""
    batch = Batch.objects.get(id=batch_id)
    return serve_key(EngineKey(batch.revision_id, batch.deployment_id or ""))


def finalize(batch_id: str) -> Batch | None:
    return batch_finalize(batch_id=batch_id)


def rows(n: int, **body: Any) -> list[dict[str, Any]]:
    return [
        request_line(f"task-{i}", content=f"Question {i}: " + "why " * (i % 7), **body)
        for i in range(n)
    ]


@pytest.fixture
def in_process_worker(transactional_db: None, settings: Any) -> Iterator[WorkerRuntime]:
    settings.ITEM_LEASE_SECONDS = 30
    runtime = WorkerRuntime(threads=1, sweep_interval=1.0).start()
    yield runtime
    runtime.stop()


@pytest.fixture
def wakes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The engine wake-ups sent (the broker is not what is under test where this is used)."""
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(engine_wake, "send", lambda *args: sent.append(args))
    return sent
