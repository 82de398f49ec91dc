"""The interactive wake-up: start serving a key whose interactive requests wait.

A run already serving the key (in any worker) pops them on its own; this message starts one
where none does. It outranks batch wake-ups among the messages a worker holds.
"""

from __future__ import annotations

import dramatiq

from batches.tasks import ENGINE_TIME_LIMIT_MS, serve_engine_key

INTERACTIVE_WAKE_PRIORITY = 0  # before every batch wake-up (10) a worker holds


@dramatiq.actor(
    queue_name="engine",
    max_retries=0,
    time_limit=ENGINE_TIME_LIMIT_MS,
    priority=INTERACTIVE_WAKE_PRIORITY,
)
def interactive_wake(revision_id: str, deployment_id: str = "") -> None:
    serve_engine_key(
        revision_id, deployment_id, wake_interactive=lambda: _send_again(revision_id, deployment_id)
    )


def _send_again(revision_id: str, deployment_id: str) -> None:
    interactive_wake.send(revision_id, deployment_id)
