"""The web process under faults: Redis down, database connections killed, the process killed
mid-upload and mid-create."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

import psycopg
import pytest
from django.db import connection

from batches.models import Batch, BatchItem, IdempotencyRecord
from billing.models import LedgerEntry
from files.models import File
from tests.conftest import Api, jsonl, make_tenant, postgres_only, redis_only
from tests.faults.conftest import (
    Http,
    Stack,
    backends_of,
    batch_rows,
    check_run,
    items_done,
    terminate_backends,
    wait_for,
)

pytestmark = [postgres_only]


def _envelope_503(status: int, headers: dict[str, str], body: Any) -> None:
    assert status == 503, body
    assert body["error"]["type"] == "server_error"
    assert body["error"]["code"] == "backend_unavailable"
    lowered = {k.lower(): v for k, v in headers.items()}
    assert int(lowered["retry-after"]) >= 1
    assert lowered["x-should-retry"] == "true"


@pytest.mark.django_db(transaction=True)
def test_api_answers_503_in_the_envelope_when_its_database_connection_was_killed(
    api: Api, catalog_model
):
    """Before the fix: a killed connection answered 500 (the SDK then retried blindly)."""
    assert api.get("/v1/batches").status_code == 200
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (own,) = cursor.fetchone()
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"]
    ) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [own])
    response = api.get("/v1/batches")
    _envelope_503(response.status_code, dict(response.items()), response.json())
    connection.close()  # what the server does between requests (CONN_HEALTH_CHECKS)
    assert api.get("/v1/batches").status_code == 200


@redis_only
@pytest.mark.django_db(transaction=True)
def test_server_replaces_connections_the_database_dropped(stack: Stack, catalog_model):
    """With persistent connections and no health check, the next request after a database
    restart or a terminated session answered 500."""
    tenant = make_tenant("faults")
    web = stack.web_with(threads=1)
    client = Http(stack.web_port, tenant.write_key)
    assert client.json("GET", "/v1/batches")[0] == 200
    killed = terminate_backends(backends_of(web.pids()))
    assert killed >= 1
    status, body = client.json("GET", "/v1/batches")
    assert status == 200, body


@redis_only
@pytest.mark.django_db(transaction=True)
def test_create_answers_200_while_redis_is_down_and_the_sweeper_wakes_the_work(
    stack: Stack, catalog_model, scenario
):
    """Before the fix: the batch and its hold were committed but the answer was 500."""
    tenant = make_tenant("faults")
    stack.web_with()
    stack.workers({})
    client = Http(stack.web_port, tenant.write_key)
    rows = batch_rows(6)
    file_id = client.upload(jsonl(*rows))
    stack.kill_redis()
    status, data = client.create(file_id, "redis-down")
    assert status == 200, data
    assert Batch.objects.filter(id=data["id"]).exists()
    assert LedgerEntry.objects.filter(batch_id=data["id"], kind="hold").count() == 1
    status, again = client.json("GET", f"/v1/batches/{data['id']}")
    assert status == 200, again
    # Redis comes back empty: the wake-up message is gone; the workers' sweeper re-wakes it.
    stack.start_redis()
    since = time.monotonic()
    wait_for(lambda: items_done(data["id"]), what="the first item after Redis came back")
    record = scenario("redis down at create")
    record.recovery.append(time.monotonic() - since)
    record.notes.append("recovery = Redis back to first item done")
    record.add(check_run(client, data["id"], rows))
    record.assert_clean()


# -- the web process killed mid-upload and mid-create ----------------------------------------


@redis_only
@pytest.mark.django_db(transaction=True)
def test_web_killed_mid_upload_then_the_upload_retried(stack: Stack, catalog_model, scenario):
    tenant = make_tenant("faults")
    stack.web_with()
    client = Http(stack.web_port, tenant.write_key)
    rows = batch_rows(40)
    body, content_type = client.upload_body(jsonl(*rows))
    with socket.create_connection(("127.0.0.1", stack.web_port)) as sock:
        head = (
            f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {tenant.write_key}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        sock.sendall(head + body[: len(body) // 2])
        time.sleep(0.5)  # let the server start consuming the body
        assert stack.web is not None
        stack.web.kill9()
    stack.web_with()
    client.port = stack.web_port
    file_id = client.upload(jsonl(*rows))
    assert File.objects.filter(status=File.Status.PROCESSED).count() == 1
    status, data = client.create(file_id, "after-upload-crash")
    assert status == 200, data
    stack.workers({})
    record = scenario("web kill -9 mid-upload")
    record.add(check_run(client, data["id"], rows))
    record.assert_clean()


@redis_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("point", ["batch_create.key_taken", "batch_create.in_transaction"])
def test_web_killed_mid_create_then_the_same_key_retried(
    stack: Stack, catalog_model, scenario, point: str
):
    """Before the fix: the retry got 409 idempotency_key_in_use for 10 minutes."""
    tenant = make_tenant("faults")
    web = stack.web_with(BOARDWALK_TEST_FAULT_POINT=point)
    client = Http(stack.web_port, tenant.write_key)
    rows = batch_rows(30)
    file_id = client.upload(jsonl(*rows))
    answered: list[Any] = []

    def doomed() -> None:
        try:
            answered.append(client.create(file_id, "crash-key"))
        except OSError as exc:  # the connection dies with the process
            answered.append(exc)

    thread = threading.Thread(target=doomed)
    thread.start()
    wait_for(web.stopped_pid, timeout=60, what=f"the web process to stop at {point}")
    assert IdempotencyRecord.objects.filter(key="crash-key").count() <= 1
    web.kill9()
    thread.join(timeout=30)
    assert answered and not isinstance(answered[0], tuple), answered  # it never answered
    stack.web_with()
    client.port = stack.web_port
    # Warm the new process (its first plan loads the tokenizer) so the figure is the key's.
    warm = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
    status, body = client.json("POST", "/v1/batches/estimate", dict(warm, completion_window="24h"))
    assert status == 200, body
    since = time.monotonic()
    status, data = client.create(file_id, "crash-key")
    retry_seconds = time.monotonic() - since
    assert status == 200, data
    assert Batch.objects.count() == 1
    assert LedgerEntry.objects.filter(kind="hold").count() == 1
    assert BatchItem.objects.count() == len(rows)
    status, again = client.create(file_id, "crash-key")
    assert (status, again["id"]) == (200, data["id"])
    stack.workers({})
    record = scenario(f"web kill -9 {point.split('.')[1]}")
    record.add(check_run(client, data["id"], rows))
    record.recovery.append(retry_seconds)
    record.notes.append("recovery = the retried create's answer time")
    record.assert_clean()


@redis_only
@pytest.mark.django_db(transaction=True)
def test_a_second_create_in_flight_answers_with_the_first_batch(stack: Stack, catalog_model):
    """The owner lock never breaks the race guarantee: a live owner keeps its key."""
    tenant = make_tenant("faults")
    web = stack.web_with(BOARDWALK_TEST_FAULT_POINT="batch_create.key_taken")
    client = Http(stack.web_port, tenant.write_key)
    file_id = client.upload(jsonl(*batch_rows(3)))
    first: list[Any] = []
    thread = threading.Thread(target=lambda: first.append(client.create(file_id, "live")))
    thread.start()
    stopped = wait_for(web.stopped_pid, timeout=60, what="the owner to stop holding the key")
    # A second web process: the owner is alive (only paused), so the key is in use.
    second = stack.start_web(name="web-2")
    try:
        retry = Http(second.port, tenant.write_key)
        status, body = retry.create(file_id, "live")
        assert status == 409, body
        assert body["error"]["code"] == "idempotency_key_in_use"
        os.kill(stopped, signal.SIGCONT)
        thread.join(timeout=60)
        assert first and first[0][0] == 200, first
        status, data = retry.create(file_id, "live")
        assert (status, data["id"]) == (200, first[0][1]["id"])
        assert Batch.objects.count() == 1
        assert LedgerEntry.objects.filter(kind="hold").count() == 1
    finally:
        second.stop()
