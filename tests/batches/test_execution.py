"""The execution pipeline and worker liveness: containment, bounded
attempts, fairness between organizations, tenant-scoped prefix reuse, fencing, recovery."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections, transaction
from rest_framework.test import APIClient

from batches.execution import serve_key
from batches.lifecycle import batch_finalize
from batches.liveness import lock_key, session_lock_hold, worker_beat
from batches.models import Batch, BatchItem, WorkerProcess
from batches.queue import (
    EngineKey,
    LeaseHeartbeat,
    dead_workers_recover,
    item_finish,
    item_release,
    items_claim,
)
from batches.services import batch_cancel
from boardwalk import clock
from inference import runtime
from inference.models import ModelRevision
from tests.batches.conftest import rows, submit
from tests.conftest import (
    Api,
    Tenant,
    content_of,
    jsonl,
    parse_jsonl,
    postgres_only,
    request_line,
)


def _key(batch_id: str) -> EngineKey:
    batch = Batch.objects.get(id=batch_id)
    return EngineKey(batch.revision_id, batch.deployment_id or "")


def _download(api: Api, file_id: str) -> list[dict[str, Any]]:
    return parse_jsonl(content_of(api.get(f"/v1/files/{file_id}/content")))


class _PoisonedEngine:
    """A fake around the real engine: any generate call that pulls the poisoned request
    raises, as an engine does on a request that breaks it (an OOM, a tokenizer error)."""

    contains_failures = False  # the pipeline's own containment must isolate the poison
    broken = False

    def __init__(self, engine: Any, poisoned_item_id: int) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_batch_size = engine.max_batch_size
        self.media_modalities = engine.media_modalities
        self.poison = f"{poisoned_item_id}:"
        self.raised = 0

    def generate(self, requests: Any, *, aborted: Any = None) -> Iterator[Any]:
        def checked() -> Iterator[Any]:
            for request in requests:
                if request.id.startswith(self.poison):
                    self.raised += 1
                    raise RuntimeError("engine exploded")
                yield request

        return self.engine.generate(checked(), aborted=aborted)

    def clear_prefix_cache(self) -> None:
        self.engine.clear_prefix_cache()


@pytest.mark.django_db
def test_a_request_that_breaks_the_engine_ends_as_its_own_error_row(api: Api, catalog_model):
    data = submit(api, rows(6))
    poisoned = BatchItem.objects.get(batch_id=data["id"], index=2)
    revision = ModelRevision.objects.get(id=data["model_config_id"])
    real = runtime.engine_for(revision)
    fake = _PoisonedEngine(real, poisoned.id)
    runtime._engines[revision.id] = fake
    try:
        done = serve_key(_key(data["id"]))
    finally:
        runtime._engines[revision.id] = real
    assert fake.raised >= 1
    assert done == {data["id"]}
    batch = batch_finalize(batch_id=data["id"])
    assert batch is not None and batch.status == "completed"
    output = _download(api, batch.output_file_id)
    errors = _download(api, batch.error_file_id)
    assert sorted(r["custom_id"] for r in output) == [f"task-{i}" for i in (0, 1, 3, 4, 5)]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("task-2", "internal_error")]
    # Nobody was handed back to loop again: every item ran once.
    assert set(
        BatchItem.objects.filter(batch_id=data["id"]).values_list("attempts", flat=True)
    ) == {1}


@pytest.mark.django_db
def test_attempts_are_bounded_at_claim_time(api: Api, catalog_model, settings):
    """A worker that crashes on an item (and hands it back) cannot make it loop forever."""
    settings.ITEM_MAX_ATTEMPTS = 3
    data = submit(api, rows(2))
    key = _key(data["id"])
    for crash in range(3):
        claimed = items_claim(key=key, worker_id=f"w{crash}", limit=2)
        assert len(claimed) == 2
        for item in claimed:  # the crashed worker's `finally` hands everything back
            item_release(item=item, worker_id=f"w{crash}")
    assert items_claim(key=key, worker_id="w-next", limit=2) == []
    items = BatchItem.objects.filter(batch_id=data["id"])
    assert {(i.state, i.error_code, i.attempts) for i in items} == {("failed", "internal_error", 3)}
    batch = batch_finalize(batch_id=data["id"])
    assert batch is not None and batch.status == "completed"
    codes = [e["error"]["code"] for e in _download(api, batch.error_file_id)]
    assert codes == ["internal_error", "internal_error"]
    assert batch.charge_microusd == 0


@pytest.mark.django_db
def test_a_large_backlog_of_one_org_does_not_starve_another(
    api: Api, other_tenant: Tenant, catalog_model, settings
):
    settings.MAX_QUEUED_ITEMS = 10_000
    backlog = submit(api, rows(900, max_tokens=1), key="backlog")
    small = submit(other_tenant.api, rows(10, max_tokens=1), key="small")
    key = _key(backlog["id"])
    groups = 0
    while BatchItem.objects.filter(batch_id=small["id"], state="pending").exists():
        groups += 1
        assert items_claim(key=key, worker_id="w", limit=16)
        assert groups <= 3, "org B's 10 items waited behind org A's backlog"
    assert groups <= 2
    assert BatchItem.objects.filter(batch_id=backlog["id"], state="running").count() >= 8


@pytest.mark.django_db
def test_prefix_reuse_never_crosses_organizations(api: Api, other_tenant: Tenant, catalog_model):
    prompt = "Summarize the following carefully. " + "why " * 60
    # The first request of the organization computes the prompt; the engine keeps its blocks.
    first = submit(api, [request_line("a-0", content=prompt, max_tokens=2)], key="mine-1")
    serve_key(_key(first["id"]))
    mine = submit(api, [request_line("a-1", content=prompt, max_tokens=2)], key="mine-2")
    theirs = submit(
        other_tenant.api, [request_line("b-0", content=prompt, max_tokens=2)], key="theirs"
    )
    serve_key(_key(mine["id"]))  # one engine key: both organizations' items run together
    batches = [first["id"], mine["id"], theirs["id"]]
    items = BatchItem.objects.filter(batch_id__in=batches)
    assert set(items.values_list("state", flat=True)) == {"succeeded"}
    cached = {item.custom_id: item.usage_cached_tokens for item in items}
    # Within one organization the shared prompt is served from cache; across organizations,
    # never, although the other organization's identical prompt sits in the cache.
    assert cached["a-0"] == 0
    assert cached["a-1"] > 0
    assert cached["b-0"] == 0


@pytest.mark.django_db
def test_a_worker_paused_past_its_lease_cannot_publish(api: Api, catalog_model, settings):
    settings.ITEM_LEASE_SECONDS = 60
    data = submit(api, rows(1))
    item = items_claim(key=_key(data["id"]), worker_id="paused", limit=1)[0]
    with clock.travel(dt.timedelta(seconds=61)):  # nobody has re-claimed it yet
        assert not item_finish(item=item, worker_id="paused", succeeded=True, result=b"late")
    assert BatchItem.objects.get(id=item.id).state == "running"


@pytest.mark.django_db
def test_a_silent_worker_process_loses_its_leases_within_seconds(api: Api, catalog_model, settings):
    settings.ITEM_LEASE_SECONDS = 600  # leases stay long: recovery must not wait for them
    settings.WORKER_DEAD_AFTER_SECONDS = 8
    data = submit(api, rows(3))
    key = _key(data["id"])
    worker_beat(process="host-a:1:aa")
    worker_beat(process="host-b:2:bb")
    dying = items_claim(key=key, worker_id="host-a:1:aa:7", limit=2)
    alive = items_claim(key=key, worker_id="host-b:2:bb:7", limit=1)
    with clock.travel(dt.timedelta(seconds=5)):
        worker_beat(process="host-b:2:bb")
        assert dead_workers_recover() == set()  # 5 s of silence is not death yet
    with clock.travel(dt.timedelta(seconds=9)):
        assert dead_workers_recover() == {key}
        # The dead process's items are claimable again; the live one keeps its lease.
        again = items_claim(key=key, worker_id="host-c:3:cc:7", limit=5)
        assert sorted(i.id for i in again) == sorted(i.id for i in dying)
        assert not item_finish(
            item=dying[0], worker_id="host-a:1:aa:7", succeeded=True, result=b"x"
        )
        assert item_finish(item=alive[0], worker_id="host-b:2:bb:7", succeeded=True, result=b"x")
    assert not WorkerProcess.objects.filter(id="host-a:1:aa").exists()


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_killed_worker_is_seen_dead_when_its_session_ends_without_waiting(
    api: Api, catalog_model, settings
):
    """kill -9 ends the process's database session, which frees its advisory lock: its
    leases come back 2.5 beats after its last one, not after the whole silence."""
    import psycopg

    settings.ITEM_LEASE_SECONDS = 600
    settings.WORKER_DEAD_AFTER_SECONDS = 8
    data = submit(api, rows(3))
    key = _key(data["id"])
    db = connection.settings_dict
    victim = psycopg.connect(
        host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"]
    )
    victim.execute("SELECT pg_advisory_lock(%s)", [lock_key("host-v:1:vv")])
    worker_beat(process="host-v:1:vv", session_lock=True)
    worker_beat(process="host-w:2:ww", session_lock=False)  # says it holds no lock
    held = items_claim(key=key, worker_id="host-v:1:vv:7", limit=2)

    assert dead_workers_recover(me="host-w:2:ww") == set()  # its session is alive
    victim.close()  # what kill -9 does to the process's session
    assert dead_workers_recover(me="host-w:2:ww") == set()  # a cut session gets 2.5 beats

    with clock.travel(dt.timedelta(seconds=2.5 * settings.WORKER_HEARTBEAT_SECONDS + 0.5)):
        # Long before the 8 s of silence: its session is gone, so it is dead.
        assert dead_workers_recover(me="host-w:2:ww") == {key}
    assert not WorkerProcess.objects.filter(id="host-v:1:vv").exists()
    assert WorkerProcess.objects.filter(id="host-w:2:ww").exists()  # heartbeat rule only
    again = items_claim(key=key, worker_id="host-c:3:cc:7", limit=5)
    assert {i.id for i in held} <= {i.id for i in again}


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_process_holds_its_session_lock_once_per_connection():
    assert session_lock_hold(process="host-s:1:ss")
    assert session_lock_hold(process="host-s:1:ss")  # kept, not stacked
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
        assert cursor.fetchone()[0] == 1
    connection.close()  # a broken connection loses the lock; the next beat takes it again
    assert session_lock_hold(process="host-s:1:ss")


@pytest.mark.django_db
def test_request_counts_are_live_without_a_per_item_counter(api: Api, catalog_model):
    data = submit(api, rows(3))
    serve_key(_key(data["id"]), max_items=2)
    counts = api.get(f"/v1/batches/{data['id']}").json()["request_counts"]
    assert counts == {"total": 3, "completed": 2, "failed": 0}
    assert Batch.objects.get(id=data["id"]).completed == 0  # the row was never locked for it


class _StandIn:
    def __init__(self, owner: str, ids: list[int]) -> None:
        self.owner = owner
        self.ids = ids

    def held_ids(self) -> list[int]:
        return self.ids


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_the_lease_heartbeat_survives_a_killed_database_connection(
    api: Api, catalog_model, settings
):
    settings.ITEM_LEASE_SECONDS = 3  # a beat every second
    data = submit(api, rows(1))
    item = items_claim(key=_key(data["id"]), worker_id="w", limit=1)[0]
    heartbeat = LeaseHeartbeat(_StandIn("w", [item.id]))
    heartbeat.start()
    try:
        time.sleep(1.5)  # let it connect
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        killed_at = clock.now()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            expires = BatchItem.objects.get(id=item.id).lease_expires_at
            if expires is not None and expires > killed_at + dt.timedelta(seconds=2):
                break
            time.sleep(0.3)
        else:
            pytest.fail("the heartbeat stopped extending the lease after a database error")
        assert heartbeat.is_alive()
    finally:
        heartbeat.stopped.set()
        heartbeat.join()


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_recording_a_result_never_waits_on_the_batch_row(api: Api, catalog_model):
    data = submit(api, rows(1))
    item = items_claim(key=_key(data["id"]), worker_id="w", limit=1)[0]
    locked = threading.Event()
    release = threading.Event()

    def hold_batch_row() -> None:  # another worker frozen inside a transaction
        try:
            with transaction.atomic():
                Batch.objects.select_for_update().get(id=data["id"])
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_batch_row)
    holder.start()
    try:
        assert locked.wait(10)
        finished: list[bool] = []

        def write() -> None:
            try:
                finished.append(item_finish(item=item, worker_id="w", succeeded=True, result=b"x"))
            finally:
                connections.close_all()

        writer = threading.Thread(target=write)
        writer.start()
        writer.join(20)
        assert finished == [True], "the result write queued behind the locked batch row"
    finally:
        release.set()
        holder.join()


@postgres_only
@pytest.mark.django_db
def test_postgres_lock_and_transaction_times_are_bounded():
    with connection.cursor() as cursor:
        values = {}
        for name in ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout"):
            cursor.execute(f"SHOW {name}")
            values[name] = cursor.fetchone()[0]
    assert all(value not in ("0", "0ms") for value in values.values()), values


def _create_and_delete_at_once(tenant: Tenant, attempt: int) -> dict[str, Any]:
    file_id = tenant.api.upload(jsonl(*rows(60, max_tokens=1))).json()["id"]
    answers: dict[str, Any] = {"file_id": file_id}
    start = threading.Barrier(2)

    def create() -> None:
        try:
            start.wait()
            answers["create"] = Api(APIClient(), tenant.write_key).post(
                "/v1/batches",
                {
                    "input_file_id": file_id,
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "24h",
                },
                HTTP_IDEMPOTENCY_KEY=f"race-{attempt}",
            )
        finally:
            connections.close_all()

    def delete() -> None:
        try:
            start.wait()
            time.sleep(0.05)  # land while the acceptance is still planning
            answers["delete"] = Api(APIClient(), tenant.write_key).delete(f"/v1/files/{file_id}")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=create), threading.Thread(target=delete)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_deleting_the_input_while_a_batch_is_accepted_never_gives_two_200s(
    tenant: Tenant, catalog_model
):
    for attempt in range(3):
        answers = _create_and_delete_at_once(tenant, attempt)
        statuses = (answers["create"].status_code, answers["delete"].status_code)
        # A create that waited out the lock bound on the file row may answer a retryable 503
        # instead of the 400: still never two 200s, and nothing created.
        assert statuses in ((200, 409), (400, 200), (503, 200)), statuses
        if statuses == (200, 409):
            assert answers["delete"].json()["error"]["code"] == "file_in_use"
            batch = Batch.objects.get(id=answers["create"].json()["id"])
            assert batch.input_file.status == "processed"
            batch_cancel(batch=batch)
        else:
            assert answers["create"].json()["error"]["code"] in (
                "invalid_input_file_id",
                "backend_unavailable",
            )
            assert not Batch.objects.filter(input_file_id=answers["file_id"]).exists()


@pytest.mark.django_db
def test_every_full_claim_group_wakes_another_worker(api: Api, catalog_model, settings):
    # Scale-out: wake-ups spread while work is waiting, one per full group, none after.
    settings.EXECUTION_CLAIM_GROUP = 4
    batch = submit(api, rows(10, max_tokens=1), key="fan-out")
    wakes: list[int] = []

    def more_work() -> None:
        wakes.append(BatchItem.objects.filter(batch_id=batch["id"], state="pending").count())

    serve_key(_key(batch["id"]), on_more_work=more_work)
    assert wakes == [6, 2]  # groups of 4, 4 and 2: the short last group wakes nobody
    assert not BatchItem.objects.filter(batch_id=batch["id"], state="pending").exists()


@pytest.mark.django_db
def test_a_claim_does_not_load_the_input_files_per_line_json(api: Api, catalog_model):
    # File.line_index and prompt_tokens grow with the file: parsed for every claimed row, a
    # claim of a 50,000-line file cost O(rows x lines). The worker needs neither.
    data = submit(api, rows(3))
    items = items_claim(key=_key(data["id"]), worker_id="w", limit=3)
    assert len(items) == 3
    for item in items:
        deferred = item.batch.input_file.get_deferred_fields()
        assert {"line_index", "prompt_tokens"} <= deferred
        assert item.batch.input_file.storage_name  # what the worker reads is there


@pytest.mark.django_db(transaction=True)
def test_a_worker_claims_no_more_than_its_engine_and_queue_take(api: Api, catalog_model, settings):
    # Items claimed beyond what the engine has pulled wait in the worker, and a worker that
    # dies takes them with it until its leases are recovered: the prepare stage claims only
    # what the engine's queue has room for (before: one more whole group on top of it).
    from inference.demo.fake_engine import FakeEngine

    settings.EXECUTION_CLAIM_GROUP = 4
    data = submit(api, rows(24, max_tokens=3), key="bounded-claims")
    revision = ModelRevision.objects.get(id=data["model_config_id"])
    real = runtime.engine_for(revision)
    pulled = 0

    class Counting(FakeEngine):
        def add(self, request: Any) -> None:
            nonlocal pulled
            pulled += 1
            super().add(request)

    fake = Counting(
        real.tokenizer, context_length=revision.context_length, max_batch_size=4, step_seconds=0.02
    )
    claimed = BatchItem.objects.filter(batch_id=data["id"], started_at__isnull=False)
    most = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal most
        try:
            while not stop.is_set():
                most = max(most, claimed.count() - pulled)
                time.sleep(0.002)
        finally:
            connection.close()

    watcher = threading.Thread(target=watch)
    runtime._engines[revision.id] = fake
    watcher.start()
    try:
        done = serve_key(_key(data["id"]), threaded=True)
    finally:
        stop.set()
        watcher.join()
        runtime._engines[revision.id] = real
    assert done == {data["id"]}
    assert BatchItem.objects.filter(batch_id=data["id"], state="succeeded").count() == 24
    assert 0 < most <= 4  # the engine's queue (max_batch_size), never a group more
