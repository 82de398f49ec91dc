"""Dramatiq actors: thin, idempotent, enqueued after commit. They take ids and call services.

Queues: "engine" runs generation (long, one per engine key at a time per process);
"batches" runs finalization and sweeps (short).
"""

from __future__ import annotations

import logging

import dramatiq

from batches.items import EngineKey, keys_with_claimable_items
from batches.lifecycle import NotReady, batch_finalize
from batches.sweeps import sweep_work
from webhooks.delivery import deliveries_due
from webhooks.tasks import webhook_deliver

logger = logging.getLogger(__name__)

ENGINE_BUDGET_SECONDS = 10 * 60  # then the actor re-enqueues itself if work remains
ENGINE_TIME_LIMIT_MS = 20 * 60 * 1000


# Lower numbers run first among messages a worker holds: a finished batch's finalization
# does not wait behind the wake-ups its own run sent (one per full claim group).
ENGINE_WAKE_PRIORITY = 10


@dramatiq.actor(
    queue_name="engine",
    max_retries=3,
    time_limit=ENGINE_TIME_LIMIT_MS,
    priority=ENGINE_WAKE_PRIORITY,
)
def engine_wake(revision_id: str, deployment_id: str = "") -> None:
    # Imported here on purpose: the web process declares this actor only to send it, and must
    # never load the engine (torch); only worker processes run it.
    from batches.execution import serve_key

    key = EngineKey(revision_id, deployment_id)
    sent: set[str] = set()

    def batch_done(batch_id: str) -> None:  # finalize as soon as known, not at the end
        sent.add(batch_id)
        finalize.send(batch_id)

    done = serve_key(
        key,
        budget_seconds=ENGINE_BUDGET_SECONDS,
        threaded=True,
        on_batch_done=batch_done,
        on_more_work=lambda: _wake_another(revision_id, deployment_id),
    )
    for batch_id in sorted(done - sent):
        finalize.send(batch_id)
    if key in keys_with_claimable_items():
        engine_wake.send(revision_id, deployment_id)  # budget spent: continue in a new message


def _wake_another(revision_id: str, deployment_id: str) -> None:
    engine_wake.send(revision_id, deployment_id)


@dramatiq.actor(queue_name="batches", max_retries=20, min_backoff=1_000, max_backoff=30_000)
def finalize(batch_id: str) -> None:
    try:
        batch_finalize(batch_id=batch_id)
    except NotReady:
        finalize.send_with_options(args=(batch_id,), delay=2_000)


@dramatiq.actor(queue_name="batches", max_retries=0)
def sweep() -> None:
    report = sweep_work()
    for batch_id in report.to_finalize:
        finalize.send(batch_id)
    for key in report.to_wake:
        engine_wake.send(key.revision_id, key.deployment_id)
    for delivery_id in deliveries_due():  # webhook deliveries whose message was lost or due
        webhook_deliver.send(delivery_id)
