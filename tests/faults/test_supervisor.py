"""`run_worker --devices LIST`: one worker process per device, each reporting its device; a
child killed is started again, and stopping the supervisor stops every child.
Real processes on PostgreSQL and a private Redis, two CPU "devices" standing in for GPUs."""

from __future__ import annotations

import os
import signal

import pytest

from batches.models import WorkerProcess
from tests.conftest import postgres_only, redis_only
from tests.faults.conftest import Stack, batch_rows, check_run, needs_redis_server, submit, wait_for
from tests.faults.test_worker_faults import _client

pytestmark = [
    postgres_only,
    redis_only,
    needs_redis_server,
    pytest.mark.django_db(transaction=True),
]


def _rows() -> dict[int, str]:
    """pid → device of the live worker rows (an id is host:pid:random)."""
    return {int(w.id.split(":")[1]): w.device for w in WorkerProcess.objects.all()}


def test_one_worker_per_device_restarted_when_killed_and_stopped_together(
    stack: Stack, catalog_model
):
    stack.tidy(workers=True)
    client = _client(stack)
    supervisor = stack._spawn(
        "supervisor", ["run_worker", "--devices", "cpu,cpu", "--sweep-interval", "1"], stack.env()
    )
    first = wait_for(lambda: len(_rows()) == 2 and _rows(), timeout=180, what="two workers")
    assert set(first.values()) == {"cpu"}
    assert supervisor.pid not in first  # the supervisor itself serves nothing
    rows = batch_rows(40, tag="sup-")
    check_run(client, submit(client, rows, key="sup-1"), rows)

    victim = next(iter(first))
    os.kill(victim, signal.SIGKILL)
    replaced = wait_for(
        lambda: len(_rows()) == 2 and victim not in _rows() and _rows(),
        timeout=180,
        what="the killed worker's replacement",
    )
    assert set(replaced.values()) == {"cpu"} and len(set(replaced) - set(first)) == 1

    supervisor.signal_all(signal.SIGTERM)
    supervisor.popen.wait(timeout=60)
    assert supervisor.popen.returncode == 0
    wait_for(lambda: not WorkerProcess.objects.exists(), timeout=30, what="the rows to go")
