from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from openai import OpenAI

from batches.execution import serve_key
from batches.lifecycle import batch_finalize
from batches.models import Batch
from batches.queue import EngineKey
from batches.tasks import engine_wake
from inference import runtime
from inference.demo.fake_engine import FakeEngine
from inference.engine.types import GenerationResult
from inference.models import CatalogModel
from project.worker_runtime import WorkerRuntime
from tests.conftest import Api, Tenant, jsonl, request_line


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


@pytest.fixture
def short_linger(settings: Any) -> None:
    """A run woken for interactive work ends soon after its last request, before teardown
    (one still lingering holds its database sessions past the test database's end)."""
    settings.INTERACTIVE_LINGER_SECONDS = 0.5


@pytest.fixture
def sdk(live_server: Any, tenant: Tenant) -> Iterator[OpenAI]:
    """The official SDK on the live server, as the tenant, strict and without retries."""
    client = OpenAI(
        base_url=f"{live_server.url}/v1",
        api_key=tenant.write_key,
        _strict_response_validation=True,
        http_client=httpx2.Client(),
        max_retries=0,
    )
    yield client
    client.close()


class RecordingFake(FakeEngine):
    """The fake engine, recording the ids it was told to abort and the rows it freed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.told: set[str] = set()
        self.freed: list[str] = []

    def abort(self, request_ids: Any) -> None:
        self.told |= set(request_ids)
        super().abort(request_ids)

    def step(self, **options: Any) -> list[Any]:
        outputs = super().step(**options)
        self.freed += [o.id for o in outputs if isinstance(o, GenerationResult) and o.aborted]
        return outputs


@pytest.fixture
def fake_engine(catalog_model: CatalogModel) -> Iterator[RecordingFake]:
    """The catalog model's engine in this process replaced by a fake stepping every 20 ms
    (one token a step), so a request's length is its time."""
    revision = catalog_model.revision
    real = runtime.engine_for(revision)
    fake = RecordingFake(
        real.tokenizer,
        context_length=revision.context_length,
        max_batch_size=4,
        step_seconds=0.02,
        abort_poll_seconds=0.04,
    )
    runtime._engines[revision.id] = fake
    yield fake
    runtime._engines[revision.id] = real
