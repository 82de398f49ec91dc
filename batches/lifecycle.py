"""Batch state transitions after acceptance: complete, expire, fail, and finalize.

Every transition is a compare-and-set on the batch row, and finalization is idempotent
(docs/ARCHITECTURE.md decision 5): result files have deterministic ids, the batch row publishes them
in one update, and billing keys its entries by batch. A process killed at any point leaves a state
that the next finalize attempt (or the sweep) carries to the end; nothing is published or charged
twice.
"""

from __future__ import annotations

import datetime as dt
import logging

import orjson
from django.db import transaction
from django.db.models import Q

from batches.models import Batch, BatchItem
from batches.queue import (
    batch_end_open_items,
    batch_has_open_items,
    batch_live_leases,
    batch_revoke_leases,
    items_set_charges,
)
from batches.retention import item_results_drop
from billing.metering import gpu_microseconds_by_item
from billing.pricing import TokenPrices, gpu_charge, token_charge
from billing.services import credit_settle
from boardwalk import clock
from boardwalk.codes import ItemCode
from boardwalk.faultpoints import fault_point
from boardwalk.http.pagination import list_envelope
from boardwalk.ids import derived_id
from files.crypto import Keyring
from files.limits import MAX_RESULT_FILE_BYTES
from files.models import File
from files.sealing import unseal
from files.services import file_publish_result, file_shred
from webhooks.outbox import batch_event_record

logger = logging.getLogger(__name__)

ITEM_ERROR_MESSAGES: dict[str, str] = {
    ItemCode.CONTEXT_LENGTH_EXCEEDED: "The prompt plus max_tokens exceeds the model's context "
    "length; shorten the messages or lower max_tokens.",
    ItemCode.OUTPUT_LIMIT_EXCEEDED: "The output file reached its 20 MiB limit before this row; "
    "resubmit this request in a new batch.",
    ItemCode.BATCH_CANCELLED: "The batch was cancelled before this request finished.",
    ItemCode.BATCH_EXPIRED: "The batch expired before this request finished.",
    ItemCode.BATCH_FAILED: "The batch failed before this request ran.",
    ItemCode.INSUFFICIENT_CREDIT: "Not enough credit to run this request.",
    ItemCode.INTERNAL_ERROR: "The request failed repeatedly inside the engine; retry it in a "
    "new batch.",
    ItemCode.INVALID_REQUEST: "The engine rejected the request parameters.",
    ItemCode.IMAGE_FETCH_FAILED: "An image URL of this request could not be fetched: the "
    "address is not public, the server did not answer 200 in time, or the image is over the "
    "size limit.",
    ItemCode.INVALID_MEDIA: "An image or audio part of this request could not be decoded, is "
    "not in an accepted format, or is over the size, pixel or duration limit.",
    ItemCode.INVALID_MODEL_OUTPUT: "The model's answer did not match this request's "
    "response_format schema or tools, so it was not published; retry it in a "
    "new batch, or ask the operator to turn on structured outputs in the model's server.",
    ItemCode.UPSTREAM_UNAVAILABLE: "The model's server was overloaded or unreachable on every "
    "attempt; retry this request in a new batch.",
}

_OUTCOME_ITEM_CODES: dict[str, str] = {
    Batch.Status.CANCELLED: ItemCode.BATCH_CANCELLED,
    Batch.Status.EXPIRED: ItemCode.BATCH_EXPIRED,
    Batch.Status.FAILED: ItemCode.BATCH_FAILED,
}


STOP_GRACE = dt.timedelta(seconds=15)


class NotReady(Exception):
    """Finalization must wait: items are still running under live leases."""


def batch_mark_complete_if_done(*, batch_id: str) -> bool:
    """in_progress → finalizing once no item is open. True if this call moved it."""
    if batch_has_open_items(batch_id=batch_id):
        return False
    return bool(
        Batch.objects.running()
        .filter(id=batch_id)
        .update(
            status=Batch.Status.FINALIZING,
            outcome=Batch.Status.COMPLETED,
            finalizing_at=clock.now(),
        )
    )


def batch_expire(*, batch: Batch) -> bool:
    """Claim the expiry of a batch past expires_at; its items stop and it ends `expired`."""
    moved = Batch.objects.overdue().filter(id=batch.id).update(outcome=Batch.Status.EXPIRED)
    if moved:
        batch_revoke_leases(batch_id=batch.id)
        logger.info("batch expiring id=%s", batch.id)
    return bool(moved)


def batch_fail(*, batch: Batch, code: str, message: str) -> bool:
    moved = (
        Batch.objects.running()
        .filter(id=batch.id)
        .update(
            outcome=Batch.Status.FAILED,
            errors=list_envelope([{"code": code, "message": message, "param": None, "line": None}]),
        )
    )
    if moved:
        batch_revoke_leases(batch_id=batch.id)
        logger.warning("batch failing id=%s code=%s", batch.id, code)
    return bool(moved)


def error_row(item: BatchItem, code: str) -> bytes:
    error = {"code": code, "message": ITEM_ERROR_MESSAGES.get(code, code)}
    row = {"id": item.row_id, "custom_id": item.custom_id, "response": None, "error": error}
    return orjson.dumps(row) + b"\n"


def batch_finalize(*, batch_id: str) -> Batch | None:
    """Publish a stopping or finished batch's results and settle its credit.

    Safe to call at any time and any number of times; returns the batch if it is terminal
    afterwards. Raises NotReady while a cancelled/expired batch still has live leases
    (its workers are told to stop and will let go within seconds).
    """
    batch = Batch.objects.select_related("org").filter(id=batch_id).first()
    if batch is None or batch.is_terminal:
        return batch
    if not batch.outcome:
        if not batch_mark_complete_if_done(batch_id=batch.id):
            return None
        # This call moved it, having seen no open item (and none opens again): publish.
        batch.status, batch.outcome = Batch.Status.FINALIZING, Batch.Status.COMPLETED
        return _publish(batch)
    if batch.outcome != Batch.Status.COMPLETED:
        # Stopping. Workers notice within a second and hand their items back with the GPU
        # time they spent (billed for deployments), so give them a short grace; then fence
        # off whatever still runs so no late result sneaks in after assembly.
        stopping_since = batch.cancelling_at or min(batch.expires_at, clock.now())
        if batch_live_leases(batch_id=batch.id) and clock.now() < stopping_since + STOP_GRACE:
            raise NotReady(batch.id)
        batch_revoke_leases(batch_id=batch.id)
    elif batch_has_open_items(batch_id=batch.id):
        raise NotReady(batch.id)
    return _publish(batch)


def _publish(batch: Batch) -> Batch:
    data_key = Keyring.current().unwrap(batch.key_id, batch.wrapped_key)
    stop_code = _OUTCOME_ITEM_CODES.get(batch.outcome)
    items = list(
        BatchItem.objects.filter(batch=batch)
        .order_by("index")
        .only(
            "id",
            "index",
            "custom_id",
            "row_id",
            "state",
            "error_code",
            "result",
            "usage_prompt_tokens",
            "usage_cached_tokens",
            "usage_completion_tokens",
            "usage_reasoning_tokens",
        )
    )
    # Decide every row first (deterministically, from item states that can no longer
    # change), then publish: a retry after a crash decides the same rows.
    out_rows: list[bytes] = []
    published: list[int] = []
    err_rows: list[bytes] = []
    out_size = err_size = 0
    for item in items:
        if item.state == BatchItem.State.SUCCEEDED:
            if item.result is None:
                # Another finalizer published the batch and dropped the per-item results
                # after this one read the batch row: nothing is left to do.
                batch.refresh_from_db()
                if batch.is_terminal:
                    return batch
            sealed = bytes(item.result or b"")
            row = unseal(data_key, sealed, f"{batch.id}:{item.index}".encode()) + b"\n"
            if out_size + len(row) <= MAX_RESULT_FILE_BYTES:
                out_size += len(row)
                out_rows.append(row)
                published.append(item.id)
                continue
            # A str: item.error_code holds whatever code the worker recorded.
            code: str = ItemCode.OUTPUT_LIMIT_EXCEEDED
        elif item.state == BatchItem.State.FAILED:
            code = item.error_code or ItemCode.INTERNAL_ERROR
        else:
            code = stop_code or ItemCode.INTERNAL_ERROR
        row = error_row(item, code)
        if err_size + len(row) <= MAX_RESULT_FILE_BYTES:
            # Rows the error file cannot hold are left for reconciliation
            # (docs/API.md "Result files").
            err_size += len(row)
            err_rows.append(row)
    output = file_publish_result(
        org=batch.org,
        file_id=derived_id("file-", batch.id, "output"),
        rows=out_rows,
        filename=f"{batch.id}_output.jsonl",
    )
    # No failed row, no error file: error_file_id stays null, as OpenAI answers (docs/API.md).
    errors = (
        file_publish_result(
            org=batch.org,
            file_id=derived_id("file-", batch.id, "errors"),
            rows=err_rows,
            filename=f"{batch.id}_errors.jsonl",
        )
        if err_rows
        else None
    )
    by_id = {item.id: item for item in items}
    charges = _charges(batch, [by_id[i] for i in published])
    usage = _usage([by_id[i] for i in published])
    now = clock.now()
    terminal = batch.outcome
    with transaction.atomic():
        moved = Batch.objects.filter(id=batch.id, status__in=Batch.UNFINISHED).update(
            status=terminal,
            output_file=output,
            error_file=errors,
            completed=len(published),
            failed=batch.total - len(published),
            usage=usage,
            charge_microusd=sum(charges.values()),
            **{f"{terminal}_at": now},
        )
        if moved:
            # What never ran ends with the batch, as the error file says it did.
            batch_end_open_items(batch_id=batch.id, code=stop_code or ItemCode.INTERNAL_ERROR)
            items_set_charges(charges)
            BatchItem.objects.filter(id__in=published).update(published=True)
            credit_settle(
                org_id=batch.org_id,
                batch_id=batch.id,
                charge_microusd=sum(charges.values()),
                revision_id=batch.revision_id,
                deployment_id=batch.deployment_id or "",
            )
            # The webhook outbox row commits with the terminal state, or not at all.
            batch_event_record(org_id=batch.org_id, batch_id=batch.id, status=terminal)
            fault_point("batch_publish.in_transaction")  # test only: before the commit
    # Accepted input is removed once the batch is terminal
    # (docs/API.md "Limits, retention and privacy"), and so are the sealed per-item results, now
    # copies of the published files. If this process dies right here, the retention sweep does both
    # instead.
    _shred_input(batch.input_file_id)
    item_results_drop(batch_id=batch.id)
    batch.refresh_from_db()
    if moved:
        logger.info(
            "batch %s id=%s completed=%s failed=%s charge=%s",
            terminal,
            batch.id,
            batch.completed,
            batch.failed,
            batch.charge_microusd,
        )
    return batch


def _shred_input(file_id: str) -> None:
    file = File.objects.filter(id=file_id).first()
    if file is not None:
        file_shred(file=file)


def _charges(batch: Batch, published: list[BatchItem]) -> dict[int, int]:
    if batch.billing == Batch.Billing.CATALOG:
        prices = TokenPrices(
            batch.price_input or 0, batch.price_cached_input or 0, batch.price_output or 0
        )
        return {
            item.id: token_charge(
                prices,
                prompt=item.usage_prompt_tokens,
                cached=item.usage_cached_tokens,
                completion=item.usage_completion_tokens,
            )
            for item in published
        }
    # GPU time: every item the engine worked on, published or not, every attempt
    # (docs/API.md "Billing"), in integer microseconds from the usage events.
    price = batch.gpu_second_price or 0
    return {
        item_id: gpu_charge(microseconds=us, price_per_second=price)
        for item_id, us in gpu_microseconds_by_item(batch_id=batch.id).items()
    }


def _usage(published: list[BatchItem]) -> dict:
    prompt = sum(i.usage_prompt_tokens for i in published)
    cached = sum(i.usage_cached_tokens for i in published)
    completion = sum(i.usage_completion_tokens for i in published)
    reasoning = sum(i.usage_reasoning_tokens for i in published)  # a part of `completion`
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def batches_needing_finalization() -> list[str]:
    """Batches that should be moving to a terminal state: a sweep re-drives them."""
    return list(
        Batch.objects.filter(
            Q(status__in=(Batch.Status.FINALIZING, Batch.Status.CANCELLING))
            | Q(status=Batch.Status.IN_PROGRESS) & ~Q(outcome="")
        ).values_list("id", flat=True)
    )
