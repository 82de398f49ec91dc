"""The interactive wake-up: start serving a key whose interactive requests wait.

A run already serving the key (in any worker) pops them on its own; this message starts one
where none does. It outranks batch wake-ups among the messages a worker holds.
"""

from __future__ import annotations

import dramatiq

from batches.queue import EngineKey
from batches.tasks import ENGINE_BUDGET_SECONDS, ENGINE_TIME_LIMIT_MS, engine_wake, finalize

INTERACTIVE_WAKE_PRIORITY = 0  # before every batch wake-up (10) a worker holds
FINALIZE_RETRY_MS = 2_000


@dramatiq.actor(
    queue_name="engine",
    max_retries=0,
    time_limit=ENGINE_TIME_LIMIT_MS,
    priority=INTERACTIVE_WAKE_PRIORITY,
)
def interactive_wake(revision_id: str, deployment_id: str = "") -> None:
    # Imported here: the web process declares this actor only to send it (no engine there).
    from batches.execution import serve_wake

    def wake_batch() -> None:
        engine_wake.send(revision_id, deployment_id)

    def wake_again() -> None:
        interactive_wake.send(revision_id, deployment_id)

    def finalize_now(batch_id: str) -> None:
        finalize.send(batch_id)

    def finalize_later(batch_id: str) -> None:
        finalize.send_with_options(args=(batch_id,), delay=FINALIZE_RETRY_MS)

    serve_wake(
        EngineKey(revision_id, deployment_id),
        budget_seconds=ENGINE_BUDGET_SECONDS,
        wake=wake_batch,
        finalize=finalize_now,
        finalize_later=finalize_later,
        wake_interactive=wake_again,
    )
