"""The adapter between the engine and the tables (DESIGN decision 3).

`serve_key` claims items of one engine key lazily, as the engine frees slots, feeds them to
the engine and writes each result the moment it is generated, under its fencing token. A
heartbeat thread keeps the leases alive while the engine works; a crash leaves leases to
expire and the lease-recovery sweep hands the items to the next worker.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
from django.conf import settings
from django.db import connection

from batches.items import (
    EngineKey,
    batch_has_open_items,
    item_finish,
    item_release,
    items_claim,
    items_heartbeat,
)
from batches.lifecycle import batch_fail
from batches.models import Batch, BatchItem
from boardwalk import clock
from boardwalk.ids import derived_id
from files.crypto import Keyring
from files.sealing import seal
from files.services import file_iter_bodies
from inference.chat_completions import completion_body, prompt_ids, sampling_params
from inference.engine.loading import ModelLoadError
from inference.engine.types import GenerationRequest, GenerationResult
from inference.models import ModelRevision
from inference.runtime import engine_for, engine_lock

logger = logging.getLogger(__name__)

CLAIM_GROUP = 4  # items leased per claim query; the engine pulls as it frees slots
_serving: set[EngineKey] = set()
_serving_lock = threading.Lock()


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


class _Heartbeat(threading.Thread):
    """Extends the leases of the items this worker holds until stopped."""

    def __init__(self, owner: str, held: dict[str, BatchItem]) -> None:
        super().__init__(daemon=True, name="lease-heartbeat")
        self.owner = owner
        self.held = held
        self.stopped = threading.Event()

    def run(self) -> None:
        interval = max(1.0, settings.ITEM_LEASE_SECONDS / 3)
        try:
            while not self.stopped.wait(interval):
                ids = [item.id for item in list(self.held.values())]
                items_heartbeat(worker_id=self.owner, item_ids=ids)
        finally:
            connection.close()


class _BatchKeys:
    """Unwrapped data keys of the batches this run writes results for."""

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}

    def get(self, batch: Batch) -> bytes:
        if batch.pk not in self._keys:
            self._keys[batch.pk] = Keyring.current().unwrap(batch.key_id, batch.wrapped_key)
        return self._keys[batch.pk]


def _result_row(item: BatchItem, result: GenerationResult) -> bytes:
    batch = item.batch
    body = completion_body(
        result,
        completion_id=derived_id("chatcmpl-", item.request_id),
        model=batch.model_name,
        model_config_id=batch.revision_id,
        created=int(clock.now().timestamp()),
    )
    row = {
        "id": item.row_id,
        "custom_id": item.custom_id,
        "response": {"status_code": 200, "request_id": item.request_id, "body": body},
        "error": None,
    }
    return orjson.dumps(row)


def serve_key(key: EngineKey, *, budget_seconds: float = 600.0) -> set[str]:
    """Run the engine for `key` until no claimable item is left or the budget is spent.

    Returns the ids of batches that have no open item left (ready to finalize). Only one
    thread per process serves a key at a time: a second wake-up returns at once, since the
    first claims new items as it goes.
    """
    with _serving_lock:
        if key in _serving:
            return set()
        _serving.add(key)
    try:
        return _serve(key, budget_seconds)
    finally:
        with _serving_lock:
            _serving.discard(key)


def _serve(key: EngineKey, budget_seconds: float) -> set[str]:
    revision = ModelRevision.objects.filter(id=key.revision_id).first()
    if revision is None:  # a stale message: nothing of this revision can be claimed
        return set()
    owner = worker_id()
    try:
        engine = engine_for(revision)
    except ModelLoadError as exc:
        logger.error("revision %s failed to load: %s", revision.id, type(exc).__name__)
        return _fail_batches_of(key, message=str(exc))
    tokenizer = engine.tokenizer
    keys = _BatchKeys()
    held: dict[str, BatchItem] = {}
    done: set[str] = set()
    stop_at = time.monotonic() + budget_seconds

    def requests() -> Iterator[GenerationRequest]:
        while time.monotonic() < stop_at:
            claimed = items_claim(key=key, worker_id=owner, limit=CLAIM_GROUP)
            if not claimed:
                return
            for item in claimed:
                held[f"{item.id}:{item.lease_token}"] = item
            for item in claimed:
                request_key = f"{item.id}:{item.lease_token}"
                try:
                    body = _input_body(item)
                    request = GenerationRequest(
                        request_key, prompt_ids(tokenizer, body), sampling_params(body)
                    )
                except Exception as exc:
                    # The type only: a message could quote the request's content.
                    logger.error("item %s could not be prepared: %s", item.pk, type(exc).__name__)
                    held.pop(request_key, None)
                    if item_finish(
                        item=item,
                        worker_id=owner,
                        succeeded=False,
                        result=None,
                        error_code="internal_error",
                    ):
                        _note_if_done(item, done)
                    continue
                yield request

    def aborted() -> list[str]:
        batch_ids = {item.batch_id for item in held.values()}
        if not batch_ids:
            return []
        stopping = set(
            Batch.objects.filter(id__in=batch_ids)
            .exclude(status=Batch.Status.IN_PROGRESS, outcome="", expires_at__gt=clock.now())
            .values_list("id", flat=True)
        )
        return [rid for rid, item in held.items() if item.batch_id in stopping]

    heartbeat = _Heartbeat(owner, held)
    heartbeat.start()
    try:
        with engine_lock(revision.id):
            for result in engine.generate(requests(), aborted=aborted):
                item = held.pop(result.id, None)
                if item is not None:
                    _record(item, result, owner, keys, done)
    finally:
        heartbeat.stopped.set()
        for item in held.values():  # unfinished (worker stopping): hand them back
            item_release(item=item, worker_id=owner)
    return done


def _input_body(item: BatchItem) -> dict[str, Any]:
    (body,) = file_iter_bodies(file=item.batch.input_file, spans=[item.span])
    return body


def _record(
    item: BatchItem, result: GenerationResult, owner: str, keys: _BatchKeys, done: set[str]
) -> None:
    if result.aborted:
        item_release(item=item, worker_id=owner, gpu_seconds=result.busy_seconds)
        return
    succeeded = not result.error
    sealed = None
    if succeeded:
        sealed = seal(keys.get(item.batch), _result_row(item, result), _item_aad(item))
    written = item_finish(
        item=item,
        worker_id=owner,
        succeeded=succeeded,
        result=sealed,
        error_code=result.error or "",
        prompt_tokens=result.prompt_tokens,
        cached_tokens=result.cached_tokens if succeeded else 0,
        completion_tokens=result.completion_tokens if succeeded else 0,
        gpu_seconds=result.busy_seconds,
    )
    if not written:
        logger.info("item %s lost its lease before its result was written; discarded", item.pk)
        return
    _note_if_done(item, done)


def _note_if_done(item: BatchItem, done: set[str]) -> None:
    if not batch_has_open_items(batch_id=item.batch_id):
        done.add(item.batch_id)


def _item_aad(item: BatchItem) -> bytes:
    return f"{item.batch_id}:{item.index}".encode()


def _fail_batches_of(key: EngineKey, *, message: str) -> set[str]:
    failed = set()
    for batch in Batch.objects.filter(
        revision_id=key.revision_id,
        status=Batch.Status.IN_PROGRESS,
        outcome="",
        **_deployment_filter(key),
    ):
        if batch_fail(
            batch=batch,
            code="model_load_failed",
            message="The model revision could not be loaded; no further items can run.",
        ):
            failed.add(batch.id)
    logger.error("failed %s batch(es) of %s: %s", len(failed), key, message[:200])
    return failed


def _deployment_filter(key: EngineKey) -> dict[str, Any]:
    if key.deployment_id:
        return {"deployment_id": key.deployment_id}
    return {"deployment__isnull": True}
