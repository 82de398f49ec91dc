"""The record stage: write finished results in groups, each row under its fencing token.

One transaction per group (a few tens of milliseconds of results, at most
BOARDWALK_EXECUTION_RECORD_GROUP); the batch row is never touched per item. Whether a batch
has no open item left is decided once per batch per group, and only for batches this worker
holds nothing of any more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import orjson

from batches.liveness import items_recorded_add
from batches.models import Batch, BatchItem
from batches.queue import (
    ItemOutcome,
    batches_without_open_items,
    item_release,
    items_meter,
    items_record,
)
from boardwalk import clock
from boardwalk.codes import ItemCode
from boardwalk.ids import derived_id
from files.crypto import Keyring
from files.sealing import seal
from inference.chat_completions import result_body
from inference.engine.types import GenerationResult

logger = logging.getLogger(__name__)


@dataclass
class Finished:
    """What the engine (or the prepare stage) says about one item."""

    item: BatchItem
    result: GenerationResult | None  # None: could not be prepared (error_code says why)
    error_code: str = ItemCode.INTERNAL_ERROR


class Recorder:
    """The record stage of one run: writes its finished items' results, in groups."""

    def __init__(
        self,
        *,
        owner: str,
        on_batch_done: Callable[[str], None] | None = None,
        tokenizer: Any = None,
    ) -> None:
        """`tokenizer`: the revision's, which reads results back in its dialect
        (inference.chat_completions.completion_body)."""
        self.owner = owner
        self.tokenizer = tokenizer
        self.on_batch_done = on_batch_done
        self.done: set[str] = set()
        self._keys: dict[str, bytes] = {}

    def write(self, finished: list[Finished], *, still_held: Collection[str] = ()) -> None:
        """Record a group; `still_held` are batch ids this worker still has items of."""
        outcomes: list[ItemOutcome] = []
        released: list[tuple[BatchItem, float]] = []
        for f in finished:
            if f.result is not None and f.result.aborted:
                released.append((f.item, f.result.busy_seconds))
            else:
                outcomes.append(self._outcome(f))
        written = items_record(outcomes=outcomes, worker_id=self.owner, in_transaction=items_meter)
        items_recorded_add(sum(written))
        for item, busy_seconds in released:
            item_release(item=item, worker_id=self.owner, gpu_seconds=busy_seconds)
        for outcome, ok in zip(outcomes, written, strict=True):
            if not ok:
                logger.info(
                    "item %s lost its lease before its result was written; discarded",
                    outcome.item.pk,
                )
        touched = {o.item.batch_id for o, ok in zip(outcomes, written, strict=True) if ok}
        self.check_batches(touched - set(still_held) - self.done)

    def check_batches(self, batch_ids: set[str]) -> None:
        for batch_id in sorted(batches_without_open_items(batch_ids=batch_ids)):
            if batch_id in self.done:
                continue
            self.done.add(batch_id)
            if self.on_batch_done is not None:
                self.on_batch_done(batch_id)

    def _outcome(self, f: Finished) -> ItemOutcome:
        result = f.result
        if result is None:
            return ItemOutcome(f.item, succeeded=False, error_code=f.error_code)
        if result.error:
            return ItemOutcome(
                f.item,
                succeeded=False,
                error_code=result.error,
                prompt_tokens=result.prompt_tokens,
                gpu_seconds=result.busy_seconds,
            )
        row, reasoning = _result_row(f.item, result, tokenizer=self.tokenizer)
        sealed = seal(self._key(f.item.batch), row, _item_aad(f.item))
        return ItemOutcome(
            f.item,
            succeeded=True,
            result=sealed,
            prompt_tokens=result.prompt_tokens,
            cached_tokens=result.cached_tokens,
            completion_tokens=result.completion_tokens,
            gpu_seconds=result.busy_seconds,
            reasoning_tokens=reasoning,
        )

    def _key(self, batch: Batch) -> bytes:
        if batch.pk not in self._keys:
            self._keys[batch.pk] = Keyring.current().unwrap(batch.key_id, batch.wrapped_key)
        return self._keys[batch.pk]


def _result_row(item: BatchItem, result: GenerationResult, *, tokenizer: Any) -> tuple[bytes, int]:
    """The output file's row of a result, and how many of its completion tokens are reasoning
    (as its body's usage counts them: the item's usage, the batch's and the receipt's)."""
    batch = item.batch
    body = result_body(
        result,
        tokenizer=tokenizer,
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
    return orjson.dumps(row), body["usage"]["completion_tokens_details"]["reasoning_tokens"]


def _item_aad(item: BatchItem) -> bytes:
    return f"{item.batch_id}:{item.index}".encode()
