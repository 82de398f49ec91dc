"""Interactive requests for a model a worker already holds, answered without a wake-up.

The web process rings the revision's bell (`messages.bell_channel`) as it sends each request
and its interactive wake-up (batches.interactive.relay). A worker process that holds the
revision's engine loaded and runs no engine listens on the bells of every revision it holds,
in one blocking pop over all of them, and when one rings it serves the key's interactive
requests itself, as the wake-up would (batches.interactive.tasks.interactive_wake): at once,
instead of when the broker hands the wake-up to some worker (an idle worker polls the broker
every BOARDWALK_WORKER_POLL_MS, and one that does not hold the engine must load the model).
So an interactive request to a model with no batch running reaches a worker that holds it
without waiting for a wake-up.

The wake-up still goes: a worker that takes it after the bell was answered finds the
requests taken (one existence query), or serves what is left. A busy worker does not
listen (its runs' feeds pop their own keys' requests; another key's requests wait for the
wake-up, as before), and bells nobody answered lapse with their requests' queue time; one
answered late costs that same existence query.
"""

from __future__ import annotations

import logging
import threading

from django.db import connection

from batches.interactive.messages import bell_channel, requests_waiting
from batches.interactive.tasks import interactive_wake
from batches.queue import EngineKey
from boardwalk.channels import channels
from boardwalk.logs import exception_trace
from inference.runtime import loaded_revision_ids

logger = logging.getLogger(__name__)

POP_SECONDS = 1.0  # the longest single wait on the bells (then the engines held are read again)
BUSY_POLL_SECONDS = 0.05  # while this worker runs an engine: how often to look again


class Bells(threading.Thread):
    """A worker process's listener on the bells of the revisions it holds loaded."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="boardwalk-bells")
        self.stopped = threading.Event()
        self.served = 0  # bells whose requests this listener served (tests read it)

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.listen_once()
            except Exception as exc:  # not logger.exception: a message may quote a value
                logger.warning(
                    "interactive bells failed; listening again: %s", exception_trace(exc)
                )
                self.stopped.wait(POP_SECONDS)
            finally:
                connection.close()

    def listen_once(self) -> None:
        """Wait for one bell of a revision this process holds, and serve its key when this
        process runs no engine."""
        # Imported here: batches.execution loads the engine's half of inference.
        from batches.execution import serving_nothing

        revisions = loaded_revision_ids()
        if not revisions or not serving_nothing():
            self.stopped.wait(BUSY_POLL_SECONDS)
            return
        rung = channels().pop_any(
            [bell_channel(revision_id) for revision_id in sorted(revisions)], timeout=POP_SECONDS
        )
        if rung is None or self.stopped.is_set() or not serving_nothing():
            return  # a run began here meanwhile: the wake-up reaches a worker for the rest
        revision_id, _, deployment_id = rung[1].decode().partition(":")
        if not requests_waiting(EngineKey(revision_id, deployment_id)):
            return  # rung for requests a run has taken already
        self.served += 1
        interactive_wake.fn(revision_id, deployment_id)

    def stop(self) -> None:
        self.stopped.set()
