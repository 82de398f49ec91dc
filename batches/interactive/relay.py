"""The web tier's side: hand an accepted request to the workers and read its replies."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from batches.interactive.config import setting
from batches.interactive.messages import abort_flag, decode_reply, reply_channel, request_channel
from batches.interactive.service import Accepted
from batches.interactive.tasks import interactive_wake
from boardwalk.broker import BROKER_UNREACHABLE
from boardwalk.channels import channels

logger = logging.getLogger(__name__)

ABORT_TTL_SECONDS = 120.0


class NotTaken(Exception):
    """No worker took the request in time."""


def dispatch(accepted: Accepted) -> None:
    key = accepted.key
    channels().push(
        request_channel(key),
        accepted.submitted.encode(),
        ttl=setting("INTERACTIVE_QUEUE_SECONDS") + 5,
    )
    try:
        interactive_wake.send(key.revision_id, key.deployment_id)
    except BROKER_UNREACHABLE as exc:
        # A worker already serving the key still takes it; else it times out as not taken.
        logger.error("broker unreachable; interactive wake-up not sent: %s", type(exc).__name__)


def wait_taken(accepted: Accepted) -> dict[str, Any] | None:
    """Return once a worker has the request: None, or the error it was refused with before
    it ran. NotTaken (and the request withdrawn) if no worker took it within
    BOARDWALK_INTERACTIVE_QUEUE_SECONDS."""
    message = _pop(accepted, setting("INTERACTIVE_QUEUE_SECONDS"))
    if message is None:
        abort(accepted)
        raise NotTaken
    return None if message["kind"] == "taken" else message


def replies(accepted: Accepted) -> Iterator[dict[str, Any]]:
    """The request's replies after "taken", up to its "result" or "error"; an "error" with
    code "timeout" when the run takes longer than BOARDWALK_INTERACTIVE_TIMEOUT_SECONDS."""
    until = time.monotonic() + setting("INTERACTIVE_TIMEOUT_SECONDS")
    while True:
        message = _pop(accepted, until - time.monotonic())
        if message is None:
            abort(accepted)
            yield {"kind": "error", "code": "timeout"}
            return
        if message["kind"] == "aborted":
            message = {"kind": "error", "code": "aborted"}
        yield message
        if message["kind"] in ("result", "error"):
            channels().delete(reply_channel(accepted.submitted.id))
            return


def abort(accepted: Accepted) -> None:
    """Tell the worker to stop the request (the client went away, or gave up)."""
    channels().flag(abort_flag(accepted.submitted.id), ttl=ABORT_TTL_SECONDS)


def _pop(accepted: Accepted, timeout: float) -> dict[str, Any] | None:
    if timeout <= 0:
        return None
    raw = channels().pop(reply_channel(accepted.submitted.id), timeout=timeout)
    return None if raw is None else decode_reply(accepted.submitted, raw)
