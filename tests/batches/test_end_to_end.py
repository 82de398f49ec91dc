"""Whole flows with real workers: upload → create → poll → download
(docs/API.md "Batches", "Result files").

- embedded shape: the in-process Dramatiq worker that `manage.py serve` runs (StubBroker
  without REDIS_URL, the Redis broker with it);
- production shape (PostgreSQL + Redis): `manage.py run_worker` in separate processes, one
  of them killed with SIGKILL mid-batch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection

from batches.models import Batch, BatchItem
from inference import runtime
from inference.engine.process import EngineProcess
from inference.models import ModelRevision
from inference.rendering import render_prompt
from inference.runtime import engine_lock, tokenizer_for
from project.worker_runtime import WorkerRuntime
from tests.batches.conftest import rows, submit
from tests.conftest import ROOT, Api, content_of, parse_jsonl, postgres_only, redis_only

TERMINAL = {"completed", "cancelled", "failed", "expired"}


def wait_for(predicate, *, timeout: float = 180.0, what: str = "condition") -> Any:
    """Poll for asynchronous work to finish (not for time to pass: no clock depends on it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def wait_terminal(api: Api, batch_id: str) -> dict[str, Any]:
    def poll() -> dict[str, Any] | None:
        data = api.get(f"/v1/batches/{batch_id}").json()
        return data if data["status"] in TERMINAL else None

    return wait_for(poll, what=f"batch {batch_id} to finish")


def check_results(api: Api, payload: dict[str, Any], inputs: list[dict[str, Any]]) -> list[dict]:
    output = parse_jsonl(content_of(api.get(f"/v1/files/{payload['output_file_id']}/content")))
    errors = (
        parse_jsonl(content_of(api.get(f"/v1/files/{payload['error_file_id']}/content")))
        if payload["error_file_id"]
        else []
    )
    assert bool(errors) == (payload["request_counts"]["failed"] > 0)
    ids = [r["custom_id"] for r in output] + [r["custom_id"] for r in errors]
    assert sorted(ids) == sorted(r["custom_id"] for r in inputs), "every item exactly once"
    assert len(set(ids)) == len(ids)
    counts = payload["request_counts"]
    assert counts["total"] == len(inputs)
    assert counts["completed"] == len(output)
    assert counts["failed"] == len(errors)
    revision = ModelRevision.objects.get(id=payload["model_config_id"])
    tokenizer = tokenizer_for(revision)
    by_id = {row["custom_id"]: row for row in inputs}
    for row in output:
        usage = row["response"]["body"]["usage"]
        messages = by_id[row["custom_id"]]["body"]["messages"]
        assert usage["prompt_tokens"] == len(render_prompt(tokenizer, messages))
        completion = row["response"]["body"]["choices"][0]
        assert usage["completion_tokens"] >= 1
        assert completion["finish_reason"] in ("stop", "length")
    return output


@pytest.mark.django_db(transaction=True)
def test_embedded_end_to_end(api: Api, catalog_model, in_process_worker: WorkerRuntime):
    inputs = rows(8)
    data = submit(api, inputs)
    payload = wait_terminal(api, data["id"])
    assert payload["status"] == "completed"
    output = check_results(api, payload, inputs)
    assert len(output) == 8
    assert int(payload["charge_microusd"]) > 0
    assert payload["usage"]["input_tokens"] == sum(
        r["response"]["body"]["usage"]["prompt_tokens"] for r in output
    )


@pytest.mark.django_db(transaction=True)
def test_embedded_end_to_end_with_the_engine_in_its_own_process(
    api: Api, catalog_model, in_process_worker: WorkerRuntime, settings
):
    """The default outside tests: the worker feeds an engine process over pipes."""
    settings.ENGINE_PROCESS = True
    inputs = rows(6)
    try:
        data = submit(api, inputs)
        payload = wait_terminal(api, data["id"])
        engine = runtime._engines.get(catalog_model.revision_id)
        assert isinstance(engine, EngineProcess) and engine.pid != os.getpid()
    finally:
        runtime.engine_drop(catalog_model.revision_id)  # stops the child
    assert payload["status"] == "completed"
    output = check_results(api, payload, inputs)
    assert len(output) == 6
    assert int(payload["charge_microusd"]) > 0
    assert engine.broken is False and not engine._process.is_alive()


@pytest.mark.django_db(transaction=True)
def test_embedded_cancel_before_the_worker_starts(
    api: Api, catalog_model, in_process_worker: WorkerRuntime
):
    inputs = rows(4)
    # Hold the engine so the worker cannot start generating before the cancel lands.
    with engine_lock(catalog_model.revision_id):
        data = submit(api, inputs)
        assert api.post(f"/v1/batches/{data['id']}/cancel").json()["status"] == "cancelling"
    payload = wait_terminal(api, data["id"])
    assert payload["status"] == "cancelled"
    check_results(api, payload, inputs)
    errors = parse_jsonl(content_of(api.get(f"/v1/files/{payload['error_file_id']}/content")))
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert payload["charge_microusd"] == "0"


# -- production shape: PostgreSQL + Redis + separate worker processes -----------------------


def _worker_env(tmp_path: Path) -> dict[str, str]:
    db = connection.settings_dict
    host, port = db["HOST"] or "127.0.0.1", db["PORT"] or 5432
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"postgres://{db['USER']}@{host}:{port}/{db['NAME']}",
        REDIS_URL=django_settings.REDIS_URL,
        BOARDWALK_BROKER_NAMESPACE=django_settings.BROKER_NAMESPACE,
        BOARDWALK_MASTER_KEYS=django_settings.MASTER_KEYS,
        BOARDWALK_API_KEY_PEPPER=django_settings.API_KEY_PEPPER,
        DJANGO_SECRET_KEY=django_settings.SECRET_KEY,
        BOARDWALK_DATA_DIR=str(tmp_path),
        BOARDWALK_ITEM_LEASE_SECONDS="3",
        PYTHONUNBUFFERED="1",
    )
    return env


def _start_worker(tmp_path: Path, name: str) -> subprocess.Popen:
    with (tmp_path / f"{name}.log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, "manage.py", "run_worker", "--threads", "1", "--sweep-interval", "1"],
            cwd=ROOT,
            env=_worker_env(tmp_path),
            stdout=log,
            stderr=subprocess.STDOUT,
        )


@pytest.fixture
def worker_processes(transactional_db: None, tmp_path: Path) -> Iterator[list[subprocess.Popen]]:
    processes: list[subprocess.Popen] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()  # reap it: a Popen collected while running warns (an error here)


@postgres_only
@redis_only
@pytest.mark.django_db(transaction=True)
def test_production_shape_with_a_worker_killed_mid_batch(
    api: Api, catalog_model, tmp_path: Path, worker_processes: list[subprocess.Popen]
):
    inputs = rows(16, max_tokens=48)
    first = _start_worker(tmp_path, "worker-a")
    worker_processes.append(first)
    data = submit(api, inputs)
    wait_for(
        lambda: BatchItem.objects.filter(batch_id=data["id"], state="succeeded").count() >= 2,
        what="worker A to finish two items",
    )
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    running = BatchItem.objects.filter(batch_id=data["id"], state="running").count()
    worker_processes.append(_start_worker(tmp_path, "worker-b"))
    payload = wait_terminal(api, data["id"])
    assert payload["status"] == "completed", (tmp_path / "worker-b.log").read_text()[-3000:]
    output = check_results(api, payload, inputs)
    assert len(output) == len(inputs)
    items = BatchItem.objects.filter(batch_id=data["id"])
    assert all(i.published for i in items)
    if running:
        assert items.filter(attempts__gte=2).exists()  # A's abandoned items were retried by B
    assert Batch.objects.get(id=data["id"]).charge_microusd == sum(i.charge_microusd for i in items)
