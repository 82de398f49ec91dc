"""Worker processes under faults: kill -9 at random moments,
paused past the lease, Redis restarted, database sessions killed during claims and
finalization, a worker frozen inside a transaction. Written against what is visible from
outside (processes, the API, the rows), not against the worker's internals."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from batches.models import Batch, BatchItem
from tests.conftest import make_tenant, postgres_only, redis_only
from tests.faults.conftest import (
    PROCESS_SETTINGS,
    Http,
    Proc,
    Stack,
    backends_of,
    batch_rows,
    check_run,
    items_done,
    leased_by,
    needs_redis_server,
    submit,
    terminate_backends,
    time_to_reclaim,
    wait_for,
)

pytestmark = [
    postgres_only,
    redis_only,
    needs_redis_server,
    pytest.mark.django_db(transaction=True),
]

ITEMS = 200
KILL_RUNS = int(os.environ.get("FAULTS_KILL9_RUNS", "10"))
LEASE = int(PROCESS_SETTINGS["BOARDWALK_ITEM_LEASE_SECONDS"])
# The kill -9 scenario runs with the production lease: a dead worker must be noticed
# directly (its liveness row goes stale), not by waiting for its leases to run out.
DEFAULT_LEASE = 60


def _client(stack: Stack) -> Http:
    tenant = make_tenant("faults")
    stack.web_with()
    return Http(stack.web_port, tenant.write_key)


def _holder(workers: list[Proc], batch_id: str, rng: random.Random) -> Proc | None:
    """A worker that holds leases of the batch right now (waits briefly for one); None when
    the batch finished first (a fast machine can finish the rest before we look)."""

    def found() -> list[Proc] | str | None:
        holders = [w for w in workers if leased_by(w, batch_id)]
        if holders:
            return holders
        return "finished" if items_done(batch_id) >= ITEMS else None

    holders = wait_for(found, timeout=60, what="a lease holder")
    return None if holders == "finished" else rng.choice(holders)


def _freeze_first(client: Http, frozen: Proc, other: Proc, rows: list[dict], *, key: str) -> int:
    """Submit a batch that only `frozen` can start, wait until it stopped at its pause point,
    then let `other` work: the other worker cannot race it to the point (or to every item)."""
    other.signal_all(signal.SIGSTOP)
    try:
        submit(client, rows, key=key)
        return int(wait_for(frozen.stopped_pid, timeout=180, what=f"{frozen.name} to stop"))
    finally:
        other.signal_all(signal.SIGCONT)


def _wait_done(batch_id: str, count: int) -> None:
    wait_for(lambda: items_done(batch_id) >= count, what=f"{count} items done")


def _first_progress_after(batch_id: str, since: float) -> float:
    done = items_done(batch_id)
    # A batch that finished meanwhile has nothing left to make progress on.
    wait_for(
        lambda: items_done(batch_id) > done or items_done(batch_id) >= ITEMS,
        what="progress after the fault",
    )
    return time.monotonic() - since


def test_kill_9_of_a_worker_at_random_moments(stack: Stack, catalog_model, scenario):
    seed = int(os.environ.get("FAULTS_SEED", time.time_ns() % 10_000))
    rng = random.Random(seed)  # noqa: S311 - choosing fault moments, not secrets
    record = scenario("worker kill -9")
    record.notes.append(
        f"seed {seed}; production lease {DEFAULT_LEASE} s; recovery = kill to first re-claim"
    )
    client = _client(stack)
    production = {"BOARDWALK_ITEM_LEASE_SECONDS": str(DEFAULT_LEASE)}
    for run in range(KILL_RUNS):
        workers = stack.workers(production, production)
        rows = batch_rows(ITEMS, tag=f"k{run}-")
        batch_id = submit(client, rows, key=f"kill-{run}")
        moment = rng.randint(1, ITEMS // 2)
        _wait_done(batch_id, moment)
        victim = _holder(workers, batch_id, rng)
        if victim is None:  # nothing left to kill mid-way: the run still checks the invariants
            record.add(check_run(client, batch_id, rows))
            continue
        held = leased_by(victim, batch_id)
        since = time.monotonic()
        victim.kill9()
        stack.spawn_worker(**production)  # its replacement starts meanwhile, as a supervisor would
        recovery = time_to_reclaim(held, victim, since)
        if recovery is not None:
            record.recovery.append(recovery)
        record.add(check_run(client, batch_id, rows))
    record.assert_clean()


def _all_working(workers: list[Proc], batch_ids: list[str]) -> bool:
    """Every worker holds leases (or every batch is done, which the caller reports)."""
    return all(leased_by(w) for w in workers) or all(items_done(b) >= JOIN_ITEMS for b in batch_ids)


JOIN_RUNS = int(os.environ.get("FAULTS_JOIN_RUNS", "3"))
# Enough rows that the batches outlast the second worker's cold model load (rows, not
# tokens: a row's cost is mostly its claim, preparation and write). With 300 a batch, the
# faster engine finished all 600 alone on a loaded 2-core CI machine before the second
# worker had loaded its engine; on a quiet one about a third of them are done by then.
JOIN_ITEMS = 600


def test_an_idle_worker_joins_waiting_work_and_takes_over_a_killed_one(
    stack: Stack, catalog_model, scenario
):
    """Two fresh workers with production settings (60 s lease, 15 s sweep) and two batches:
    both take part without any wake-up reaching the second by luck, and when the one doing
    the work is killed the other (never warmed by hand) carries on within seconds."""
    record = scenario("idle worker joins, kill -9")
    record.notes.append("production lease 60 s, sweep 15 s; recovery = kill to first re-claim")
    client = _client(stack)
    production = {
        "BOARDWALK_ITEM_LEASE_SECONDS": str(DEFAULT_LEASE),
        "BOARDWALK_SWEEP_INTERVAL_SECONDS": "15",
    }
    joins: list[float] = []
    left: list[int] = []
    for run in range(JOIN_RUNS):
        stack.tidy(workers=True)
        workers = stack.workers(production, production)
        since = time.monotonic()
        rows = [batch_rows(JOIN_ITEMS, tag=f"j{run}{b}-") for b in "ab"]
        batch_ids = [submit(client, r, key=f"join-{run}-{i}") for i, r in enumerate(rows)]
        wait_for(
            lambda: _all_working(workers, batch_ids),  # noqa: B023 - called in this iteration
            timeout=120,
            what="both workers to hold leases",
        )
        joins.append(time.monotonic() - since)
        done = [items_done(b) for b in batch_ids]
        assert all(d < JOIN_ITEMS for d in done), f"finished before both joined ({done} done)"
        left.append(2 * JOIN_ITEMS - sum(done))
        victim = max(workers, key=lambda w: len(leased_by(w)))
        held = leased_by(victim)
        since = time.monotonic()
        victim.kill9()
        recovery = time_to_reclaim(held, victim, since)
        if recovery is not None:
            record.recovery.append(recovery)
        for batch_id, r in zip(batch_ids, rows, strict=True):
            record.add(check_run(client, batch_id, r))
    record.notes.append(
        f"second worker joined {max(joins):.1f} s after submit at most, "
        f"with {min(left)} of {2 * JOIN_ITEMS} rows left at the least"
    )
    record.assert_clean()


def test_worker_paused_past_its_lease_then_resumed(stack: Stack, catalog_model, scenario):
    client = _client(stack)
    workers = stack.workers({}, {})
    rows = batch_rows(ITEMS, tag="p-")
    batch_id = submit(client, rows, key="pause")
    wait_for(lambda: items_done(batch_id) >= 20, what="20 items done")
    victim = _holder(workers, batch_id, random.Random(0))  # noqa: S311
    record = scenario("worker SIGSTOP past lease")
    if victim is None:  # the batch finished before anyone could be paused: check the rest
        record.add(check_run(client, batch_id, rows))
        record.assert_clean()
        return
    held = leased_by(victim, batch_id)
    since = time.monotonic()
    victim.signal_all(signal.SIGSTOP)
    try:
        recovery = time_to_reclaim(held, victim, since)
        # The fault is the pause itself: hold it past two lease lengths before resuming.
        time.sleep(max(0.0, since + 2 * LEASE - time.monotonic()))
    finally:
        victim.signal_all(signal.SIGCONT)
    if recovery is not None:
        record.recovery.append(recovery)
    record.add(check_run(client, batch_id, rows))
    record.assert_clean()


def test_redis_restarted_mid_batch(stack: Stack, catalog_model, scenario):
    client = _client(stack)
    stack.workers({}, {})
    rows = batch_rows(ITEMS, tag="r-")
    batch_id = submit(client, rows, key="redis-a")
    wait_for(lambda: items_done(batch_id) >= 30, what="30 items done")
    stack.kill_redis()
    # During the outage the API still answers: a new batch is accepted (the sweeper will
    # wake it), reads work.
    late = batch_rows(20, tag="r2-")
    late_id = submit(client, late, key="redis-b")
    status, _ = client.json("GET", f"/v1/batches/{batch_id}")
    assert status == 200
    time.sleep(3)  # the outage itself
    stack.start_redis()
    since = time.monotonic()
    wait_for(lambda: items_done(late_id), what="the batch created during the outage to start")
    record = scenario("redis restart mid-batch")
    record.recovery.append(time.monotonic() - since)
    record.notes.append("recovery = Redis back to first item of the batch made meanwhile")
    record.add(check_run(client, batch_id, rows))
    record.add(check_run(client, late_id, late))
    record.assert_clean()


def test_database_sessions_killed_during_claims(stack: Stack, catalog_model, scenario):
    client = _client(stack)
    frozen_env = {"BOARDWALK_TEST_FAULT_POINT": "items_claim.locked"}
    frozen, other = stack.workers(frozen_env, {})
    rows = batch_rows(ITEMS, tag="c-")
    # Caught inside its claim transaction, holding the claimed rows locked.
    stopped = _freeze_first(client, frozen, other, rows, key="claims")
    batch_id = Batch.objects.get().id
    killed = terminate_backends(backends_of([stopped]))
    os.kill(stopped, signal.SIGCONT)
    since = time.monotonic()
    record = scenario("pg sessions killed in claims")
    record.recovery.append(_first_progress_after(batch_id, since))
    # Then every worker session, three times while the batch runs.
    for _ in range(3):
        if items_done(batch_id) >= ITEMS:
            break  # finished before the next round of kills (a fast engine)
        wait_for(lambda: items_done(batch_id) > 0, what="progress")
        killed += terminate_backends(backends_of(frozen.pids() + other.pids()))
        since = time.monotonic()
        record.recovery.append(_first_progress_after(batch_id, since))
    record.notes.append(f"{killed} sessions killed; recovery = kill to next item done")
    record.add(check_run(client, batch_id, rows))
    record.assert_clean()


def test_database_session_killed_during_finalization(stack: Stack, catalog_model, scenario):
    client = _client(stack)
    (worker,) = stack.workers({"BOARDWALK_TEST_FAULT_POINT": "batch_publish.in_transaction"})
    rows = batch_rows(30, tag="f-")
    batch_id = submit(client, rows, key="finalize")
    stopped = wait_for(worker.stopped_pid, timeout=180, what="the worker stopped in finalization")
    assert terminate_backends(backends_of([stopped])) >= 1
    os.kill(stopped, signal.SIGCONT)
    since = time.monotonic()
    stats = check_run(client, batch_id, rows)
    record = scenario("pg session killed finalizing")
    record.recovery.append(time.monotonic() - since)
    record.notes.append("recovery = kill to batch completed")
    record.add(stats)
    record.assert_clean()


def test_worker_frozen_inside_a_transaction_stalls_nobody_for_long(
    stack: Stack, catalog_model, scenario
):
    client = _client(stack)
    frozen_env = {"BOARDWALK_TEST_FAULT_POINT": "item_finish.in_transaction"}
    frozen, other = stack.workers(frozen_env, {})
    rows = batch_rows(ITEMS, tag="z-")
    stopped = _freeze_first(client, frozen, other, rows, key="frozen")
    batch_id = Batch.objects.get().id
    # Keep it frozen for three idle-in-transaction timeouts and watch the others' progress.
    idle = int(PROCESS_SETTINGS["BOARDWALK_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS"]) / 1000
    start = last = time.monotonic()
    done = items_done(batch_id)
    longest = 0.0
    try:
        while time.monotonic() < start + 3 * idle and done < ITEMS:
            time.sleep(0.1)
            now_done = items_done(batch_id)
            if now_done > done:
                done, last = now_done, time.monotonic()
            longest = max(longest, time.monotonic() - last)
    finally:
        os.kill(stopped, signal.SIGCONT)
    record = scenario("worker frozen in transaction")
    record.recovery.append(longest)
    record.notes.append("recovery = longest stall of the others while it was frozen")
    record.add(check_run(client, batch_id, rows))
    record.assert_clean()
    assert BatchItem.objects.filter(batch_id=batch_id, published=True).count() > 0
