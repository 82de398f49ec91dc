"""/readyz and /metrics."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.test import Client

from batches.models import Batch, BatchItem
from batches.queue import EngineKey, items_claim
from batches.sweeps import sweep_work
from boardwalk import clock
from boardwalk.metrics import counter_inc, labels_text
from boardwalk.models import MetricCounter
from tests.conftest import Api, Tenant, jsonl, request_line

pytestmark = pytest.mark.django_db

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.e+]+)$")


def _metrics(client: Client, **extra: Any) -> dict[str, float]:
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for line in response.content.decode().splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$", line), line
            continue
        match = _SAMPLE.match(line)
        assert match, line
        samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


def test_readyz_answers_ok_with_each_dependency():
    response = Client().get("/readyz")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "checks": {"database": "ok", "broker": "ok", "storage": "ok"},
    }


def test_readyz_is_503_in_the_envelope_when_the_broker_is_down(settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = Client().get("/readyz")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "not_ready"
    assert error["checks"]["broker"] == "unavailable"
    assert error["checks"]["database"] == "ok"
    assert response["Retry-After"]


def test_readyz_is_503_when_storage_is_not_writable(settings, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")  # a file where the content directory's parent should be
    settings.STORAGES = {
        **settings.STORAGES,
        "content": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(blocker / "content")},
        },
    }
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["error"]["checks"]["storage"] == "unavailable"


def test_metrics_report_queue_batches_and_counters(api: Api, tenant: Tenant, catalog_model: Any):
    file_id = api.upload(jsonl(request_line("a"), request_line("b"))).json()["id"]
    created = api.post(
        "/v1/batches",
        {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        HTTP_IDEMPOTENCY_KEY="m-1",
    )
    assert created.status_code == 200, created.content
    revision = Batch.objects.get().revision_id
    counter_inc("boardwalk_webhook_failures_total", {"reason": "timeout"})
    counter_inc("boardwalk_webhook_failures_total", {"reason": "timeout"}, by=2)

    samples = _metrics(Client())
    assert samples[f'boardwalk_queue_depth{{revision="{revision}"}}'] == 2
    assert samples['boardwalk_batches{status="in_progress"}'] == 1
    assert samples['boardwalk_batches{status="completed"}'] == 0
    assert samples["boardwalk_oldest_waiting_item_age_seconds"] >= 0
    assert samples['boardwalk_webhook_failures_total{reason="timeout"}'] == 3
    assert samples["boardwalk_lease_recoveries_total"] == 0
    assert samples["boardwalk_fetch_failures_total"] == 0
    # No tenant ids or content in any label.
    text = Client().get("/metrics").content.decode()
    assert tenant.org.id not in text
    assert Batch.objects.get().id not in text
    assert "Hello there" not in text

    BatchItem.objects.update(
        state="succeeded",
        usage_prompt_tokens=30,
        usage_completion_tokens=6,
        completed_at=clock.now(),
    )
    samples = _metrics(Client())
    assert samples[f'boardwalk_items_per_second{{revision="{revision}"}}'] == pytest.approx(2 / 60)
    key = labels_text({"revision": revision, "kind": "completion"})
    assert samples[f"boardwalk_tokens_per_second{{{key}}}"] == pytest.approx(12 / 60)


def test_counter_names_and_labels_are_checked():
    with pytest.raises(ValueError):
        counter_inc("no_suffix")
    with pytest.raises(ValueError):
        counter_inc("boardwalk_x_total", {"bad-label": "v"})
    counter_inc("boardwalk_x_total", {"reason": 'quote " and \\ backslash'})
    assert MetricCounter.objects.get().labels == 'reason="quote \\" and \\\\ backslash"'


def test_metrics_need_loopback_or_the_token(settings):
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 403
    settings.METRICS_TOKEN = "metrics-secret"
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    remote = Client(REMOTE_ADDR="10.1.2.3")
    assert remote.get("/metrics", HTTP_AUTHORIZATION="Bearer metrics-secret").status_code == 200


def test_the_sweeper_counts_lease_recoveries(api: Api, catalog_model: Any):
    file_id = api.upload(jsonl(request_line("a"))).json()["id"]
    api.post(
        "/v1/batches",
        {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        HTTP_IDEMPOTENCY_KEY="lease-1",
    )
    batch = Batch.objects.get()
    items_claim(key=EngineKey(batch.revision_id), worker_id="crashed", limit=1)
    with clock.travel(dt.timedelta(minutes=30)):
        sweep_work()
    samples = _metrics(Client())
    assert samples['boardwalk_lease_recoveries_total{outcome="requeued"}'] == 1
