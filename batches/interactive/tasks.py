"""The interactive wake-up: start serving a key whose interactive requests wait.

A run already serving the key (in any worker) pops them on its own; this message starts one
where none does. It outranks batch wake-ups among the messages a worker holds.
"""

from __future__ import annotations

import dramatiq

from batches.interactive.messages import request_channel
from batches.queue import EngineKey
from batches.tasks import ENGINE_BUDGET_SECONDS, ENGINE_TIME_LIMIT_MS, engine_wake, finalize
from boardwalk.channels import channels

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
    from batches.execution import serve_key
    from batches.execution.finalizer import Finalizer

    key = EngineKey(revision_id, deployment_id)
    if not channels().length(request_channel(key)):
        return  # a run serving the key took it already

    def finalize_later(batch_id: str) -> None:
        finalize.send_with_options(args=(batch_id,), delay=FINALIZE_RETRY_MS)

    def finalize_now(batch_id: str) -> None:
        finalize.send(batch_id)

    def wake_batch() -> None:
        engine_wake.send(revision_id, deployment_id)

    finalizer = Finalizer(not_ready=finalize_later, failed=finalize_now)
    try:
        done = serve_key(
            key,
            budget_seconds=ENGINE_BUDGET_SECONDS,
            threaded=True,
            interactive=True,
            on_batch_done=finalizer.submit,
            on_more_work=wake_batch,
        )
        for batch_id in sorted(done):
            finalizer.submit(batch_id)
    finally:
        finalizer.close()
    if channels().length(request_channel(key)):
        interactive_wake.send(revision_id, deployment_id)
