from __future__ import annotations

from typing import Any

from batches.models import Batch, BatchItem
from batches.selectors import batch_request_counts
from boardwalk.clock import unix
from inference.chat_completions import usage_payload


def batch_payload(batch: Batch) -> dict[str, Any]:
    terminal = batch.is_terminal
    # Fixed at finalization; until then derived from the items (no per-item counter row).
    completed, failed = (
        (batch.completed, batch.failed) if terminal else batch_request_counts(batch_id=batch.id)
    )
    pricing = None
    if batch.billing == Batch.Billing.CATALOG:
        pricing = {
            "unit": "microusd_per_million_tokens",
            "input": str(batch.price_input),
            "cached_input": str(batch.price_cached_input),
            "output": str(batch.price_output),
        }
    payload: dict[str, Any] = {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": batch.model_name,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "request_counts": {"total": batch.total, "completed": completed, "failed": failed},
        "output_file_id": batch.output_file_id if terminal else None,
        "error_file_id": batch.error_file_id if terminal else None,
        "model_config_id": batch.revision_id,
        "billing": batch.billing,
        "pricing": pricing,
        "created_at": unix(batch.created_at),
        "expires_at": unix(batch.expires_at),
        "in_progress_at": unix(batch.created_at),
        "finalizing_at": unix(batch.finalizing_at),
        "cancelling_at": unix(batch.cancelling_at),
        "completed_at": unix(batch.completed_at),
        "cancelled_at": unix(batch.cancelled_at),
        "failed_at": unix(batch.failed_at),
        "expired_at": unix(batch.expired_at),
        "errors": batch.errors,
        "metadata": batch.metadata,
        "usage": batch.usage,
    }
    if terminal:
        payload["charge_microusd"] = str(batch.charge_microusd or 0)
    return payload


def receipt_payload(item: BatchItem) -> dict[str, Any]:
    return {
        "id": item.request_id,
        "object": "request.receipt",
        "batch_id": item.batch_id,
        "custom_id": item.custom_id,
        "model_config_id": item.revision_id_key,
        # A row in the output file; else a charged row that is not (GPU time of a
        # deployment's cancelled or stopped work) and its item code.
        "status_code": 200 if item.published else None,
        "error_code": None if item.published else (item.error_code or None),
        "usage": usage_payload(
            prompt=item.usage_prompt_tokens,
            cached=item.usage_cached_tokens,
            completion=item.usage_completion_tokens,
            reasoning=item.usage_reasoning_tokens,
        ),
        "billing": item.batch.billing,
        "charge_microusd": str(item.charge_microusd),
        "created_at": unix(item.batch.created_at),
        "completed_at": unix(item.completed_at),
    }
