"""Dramatiq actors: thin, idempotent, enqueued after commit. They take ids and call services.

Queues: "engine" runs generation (long, one per engine key at a time per process);
"batches" runs finalization and sweeps (short).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import dramatiq

from batches.lifecycle import NotReady, batch_finalize
from batches.queue import EngineKey, keys_with_claimable_items
from batches.sweeps import sweep_work
from inference.selectors import revisions_too_wide_for_this_worker
from webhooks.delivery import deliveries_due
from webhooks.tasks import webhook_deliver

logger = logging.getLogger(__name__)

ENGINE_BUDGET_SECONDS = 10 * 60  # then the actor re-enqueues itself if work remains
ENGINE_TIME_LIMIT_MS = 20 * 60 * 1000


# Lower numbers run first among messages a worker holds: a finished batch's finalization
# does not wait behind the wake-ups its own run sent (one per full claim group).
ENGINE_WAKE_PRIORITY = 10
FINALIZE_RETRY_MS = 2_000  # a batch not ready yet (its stopping workers still let go)


@dramatiq.actor(
    queue_name="engine",
    max_retries=3,
    time_limit=ENGINE_TIME_LIMIT_MS,
    priority=ENGINE_WAKE_PRIORITY,
)
def engine_wake(revision_id: str, deployment_id: str = "") -> None:
    serve_engine_key(revision_id, deployment_id)


def serve_engine_key(
    revision_id: str, deployment_id: str, *, wake_interactive: Callable[[], None] | None = None
) -> None:
    """What a wake-up actor does in a worker: serve the key (batches.execution.serve_wake)."""
    # Imported here on purpose: the web process declares the wake-up actors only to send
    # them, and must never load the engine (torch); only worker processes run them.
    from batches.execution import serve_wake

    serve_wake(
        EngineKey(revision_id, deployment_id),
        budget_seconds=ENGINE_BUDGET_SECONDS,
        wake=lambda: wake_another(revision_id, deployment_id),
        finalize=finalize_now,
        finalize_later=finalize_later,
        wake_interactive=wake_interactive,
    )


def join_waiting_work() -> set[EngineKey]:
    """An idle worker process asks for the work that waits: one wake-up per engine key with
    claimable items, sent only while no thread of this process runs an engine.

    A run sends a wake-up per full claim group so that idle workers join in, but a wake-up
    can miss them: a busy process with a spare thread takes it and finds its key already
    served, a message is lost, a worker starts after the last one was sent. The liveness
    beat calls this every second, so an idle process joins within a beat or two (and is
    warm when the busy one dies) instead of at the next sweep. A busy process with one
    thread cannot fetch the message, so an idle consumer takes it; one that finds nothing
    left costs one existence query.
    """
    # Imported here: only worker processes run engines (the web process never imports them).
    from batches.execution import serving_nothing

    if not serving_nothing():
        return set()
    keys = keys_with_claimable_items()
    # Revisions this worker leaves to others (tensor-parallel over more GPUs than it owns):
    # asking for them would only wake itself and the others like it.
    too_wide = revisions_too_wide_for_this_worker({k.revision_id for k in keys})
    keys = {k for k in keys if k.revision_id not in too_wide}
    for key in sorted(keys, key=lambda k: (k.revision_id, k.deployment_id)):
        engine_wake.send(key.revision_id, key.deployment_id)
    return keys


def finalize_now(batch_id: str) -> None:
    """Ask a worker to finalize the batch now (a run recorded its last result)."""
    finalize.send(batch_id)


def finalize_later(batch_id: str) -> None:
    """Ask again after a while: the batch's stopping workers still let go of it."""
    finalize.send_with_options(args=(batch_id,), delay=FINALIZE_RETRY_MS)


def wake_another(revision_id: str, deployment_id: str) -> None:
    """One more batch wake-up for the key, so an idle worker joins in."""
    engine_wake.send(revision_id, deployment_id)


@dramatiq.actor(queue_name="batches", max_retries=20, min_backoff=1_000, max_backoff=30_000)
def finalize(batch_id: str) -> None:
    try:
        batch_finalize(batch_id=batch_id)
    except NotReady:
        finalize_later(batch_id)


@dramatiq.actor(queue_name="batches", max_retries=0)
def sweep() -> None:
    report = sweep_work()
    for batch_id in report.to_finalize:
        finalize.send(batch_id)
    for key in report.to_wake:
        engine_wake.send(key.revision_id, key.deployment_id)
    for delivery_id in deliveries_due():  # webhook deliveries whose message was lost or due
        webhook_deliver.send(delivery_id)
