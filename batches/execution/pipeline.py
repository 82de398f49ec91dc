"""Serving an engine key: what a wake-up does in a worker, and the run behind it.

    wake-up ─► serve_wake ─► serve_key ─► EngineRun (batches.execution.run):
                  │                         claim+prepare → generate → record
                  └─ Finalizer: each batch the run finishes is published in this process

Only one thread per process serves a key at a time; a wake-up that finds nothing to claim
costs one existence query.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from batches.execution.finalizer import Finalizer
from batches.execution.run import EngineRun
from batches.interactive.feed import interactive_refuse_waiting
from batches.interactive.messages import requests_waiting
from batches.lifecycle import batch_fail
from batches.models import Batch
from batches.queue import EngineKey, key_has_claimable_items
from boardwalk.codes import ErrorCode
from boardwalk.logs import exception_trace
from inference.engine.loading import ModelLoadError
from inference.engine.process import EngineProcessError
from inference.models import ModelRevision
from inference.runtime import engine_drop, engine_for, engine_lock
from inference.selectors import revisions_too_wide_for_this_worker, too_wide_for_this_worker
from inference.tokenization import media_layout_for

logger = logging.getLogger(__name__)

_serving: set[EngineKey] = set()
_serving_lock = threading.Lock()
_left: set[str] = set()  # revisions this worker left to others (logged once each)
# How long a worker that cannot serve a key waits before sending its interactive wake-up back.
LEFT_WAKE_PAUSE_SECONDS = 0.5


def serving_nothing() -> bool:
    """Whether no thread of this process is running an engine for any key right now."""
    with _serving_lock:
        return not _serving


def serve_wake(
    key: EngineKey,
    *,
    budget_seconds: float,
    wake: Callable[[], None],
    finalize: Callable[[str], None],
    finalize_later: Callable[[str], None],
    wake_interactive: Callable[[], None] | None = None,
) -> None:
    """What a wake-up for `key` does: serve it for up to `budget_seconds`, then `wake`
    again if work remains (the budget ran out: the run continues in a new message).

    With `wake_interactive`, the wake-up is for the key's interactive requests
    (batches.interactive): the run starts for them even with no claimable item, serves batch
    rows beside them, and `wake_interactive` is sent again if requests still wait after it.

    `wake` is also called for every full claim group, so that idle workers join in. Each
    batch the run finishes is finalized here as soon as its last result is recorded, not
    after a trip through the broker (batches.execution.finalizer); only what cannot finish
    here is handed to `finalize` (its finalization raised) or `finalize_later` (not ready).
    """
    # Most wake-ups find their work taken: a run sends one per full claim group so that idle
    # workers join in, and the run itself claims the rest. Such a wake-up costs this one
    # existence query, not a finalizer thread and a second query after it.
    interactive = wake_interactive is not None
    if not (requests_waiting(key) if interactive else key_has_claimable_items(key)):
        return
    if _left_to_others(key):
        # Not re-sent for batch rows: the workers that can serve the key ask for its claimable
        # work each beat (join_waiting_work). An interactive request has no such beat: its
        # wake-up goes back to the broker, after a pause so that workers which cannot serve it
        # do not pass it between them in a loop.
        if wake_interactive is not None:
            time.sleep(LEFT_WAKE_PAUSE_SECONDS)
            wake_interactive()
        return
    finalizer = Finalizer(not_ready=finalize_later, failed=finalize)
    try:
        done = serve_key(
            key,
            budget_seconds=budget_seconds,
            threaded=True,
            interactive=interactive,
            on_batch_done=finalizer.submit,
            on_more_work=wake,
        )
        for batch_id in sorted(done):
            finalizer.submit(batch_id)
    finally:
        finalizer.close()
    if key_has_claimable_items(key):
        wake()
    if wake_interactive is not None and requests_waiting(key):
        wake_interactive()


def _left_to_others(key: EngineKey) -> bool:
    """Whether this worker leaves the key's work to others (a tensor-parallel revision over
    more GPUs than it owns); said once per revision in the log. No query when the worker owns
    every GPU it sees."""
    if not revisions_too_wide_for_this_worker([key.revision_id]):
        return False
    with _serving_lock:
        first = key.revision_id not in _left
        _left.add(key.revision_id)
    if first:  # the revision is read for its message only
        logger.warning(
            "%s", too_wide_for_this_worker(ModelRevision.objects.get(id=key.revision_id))
        )
    return True


def serve_key(
    key: EngineKey,
    *,
    budget_seconds: float = 600.0,
    max_items: int | None = None,
    threaded: bool = False,
    on_batch_done: Callable[[str], None] | None = None,
    on_more_work: Callable[[], None] | None = None,
    interactive: bool = False,
) -> set[str]:
    """Run the engine for `key` until no claimable item is left or the budget is spent.

    A threaded run also serves the key's interactive requests (batches.interactive), ahead of
    its batch rows, and stays up while they come (`interactive`: a run woken for them, which
    starts with no claimable item).

    Returns the ids of batches that have no open item left (ready to finalize);
    `on_batch_done` is also called with each as soon as it is known. Only one thread per
    process serves a key at a time: a second wake-up returns at once, since the first
    claims new items as it goes. `max_items` stops claiming after that many (tests).
    `on_more_work` is called after every claim that filled a whole group: more work is
    waiting, so the caller can wake another worker. One wake-up per full group, not one per
    run: idle workers poll the broker only so often (BOARDWALK_WORKER_POLL_MS), so a chain
    of single wake-ups (each woken worker waking the next) took a poll per worker to spread
    a large batch, while several pending at once reach every idle worker in one poll. A
    wake-up that finds nothing left to claim costs one existence query.
    """
    with _serving_lock:
        if key in _serving:
            return set()
        _serving.add(key)
    try:
        # Wake-ups outnumber runs (one per full claim group, for other workers): one that
        # finds nothing costs this query, not a model load or a run's threads.
        if not interactive and not key_has_claimable_items(key):
            return set()
        revision = ModelRevision.objects.filter(id=key.revision_id).first()
        if revision is None:  # a stale message: nothing of this revision can be claimed
            return set()
        try:
            engine = engine_for(revision)
        except (ModelLoadError, EngineProcessError) as exc:
            logger.error("revision %s failed to load: %s", revision.id, exception_trace(exc))
            if interactive:  # they would wait out their queue time for nothing
                interactive_refuse_waiting(key, code=ErrorCode.MODEL_LOAD_FAILED)
            return _fail_batches_of(key, message=str(exc))
        # Media rows are laid out only for an engine that runs their encoders.
        layout = media_layout_for(revision)
        if layout is not None and layout.modality not in engine.media_modalities:
            layout = None
        run = EngineRun(
            key,
            engine,
            budget_seconds,
            max_items,
            on_batch_done,
            on_more_work,
            layout,
            # An external server is sent each row's body: its prompt is tokenized only where
            # the server's answer gives no usage (inference/external/engine.py); and its rows
            # are claimed as many at a time as it takes in flight, since a claim cost about as
            # much as dispatching its group (benchmarks/external.py).
            tokenize=not revision.is_external,
            claim_group=revision.max_in_flight if revision.is_external else None,
        )
        with engine_lock(revision.id):
            if threaded:
                run.threaded()
            else:
                run.inline()
        if run.engine_broken:
            engine_drop(revision.id)
        return run.recorder.done
    finally:
        with _serving_lock:
            _serving.discard(key)


def _fail_batches_of(key: EngineKey, *, message: str) -> set[str]:
    failed = set()
    deployment: dict[str, Any] = (
        {"deployment_id": key.deployment_id} if key.deployment_id else {"deployment__isnull": True}
    )
    for batch in Batch.objects.running().filter(revision_id=key.revision_id, **deployment):
        if batch_fail(
            batch=batch,
            code=ErrorCode.MODEL_LOAD_FAILED,
            message="The model revision could not be loaded; no further items can run.",
        ):
            failed.add(batch.id)
    logger.error("failed %s batch(es) of %s: %s", len(failed), key, message[:200])
    return failed
