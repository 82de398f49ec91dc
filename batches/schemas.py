"""The OpenAPI shapes of the batches and requests endpoints (batches.views)."""

from __future__ import annotations

from batches.batchrouter import (
    ASSIGNMENT_WINDOW,
    CACHED_INPUT_RATE,
    DEADLINE,
    INPUT_FORMAT,
    INPUT_FORMATS,
    INPUT_RATE,
    OUTPUT_RATE,
    ROLE,
    ROLES,
    TIER,
    TIERS,
    WORK_UNIT_ID,
)
from boardwalk.http.openapi import DECIMAL, INT, STR, TIMESTAMP, Schema, nullable

PRICES = {
    "type": "object",
    "properties": {"unit": STR, "input": DECIMAL, "cached_input": DECIMAL, "output": DECIMAL},
}

BATCH: Schema = {
    "type": "object",
    "required": ["id", "object", "status", "request_counts", "created_at", "expires_at"],
    "properties": {
        "id": STR,
        "object": {"type": "string", "enum": ["batch"]},
        "endpoint": STR,
        "model": STR,
        "input_file_id": STR,
        "completion_window": STR,
        "status": {
            "type": "string",
            "enum": [
                "in_progress",
                "finalizing",
                "cancelling",
                "completed",
                "cancelled",
                "failed",
                "expired",
            ],
        },
        "request_counts": {
            "type": "object",
            "required": ["total", "completed", "failed"],
            "properties": {"total": INT, "completed": INT, "failed": INT},
        },
        "output_file_id": nullable(STR),
        "error_file_id": nullable(STR),
        "model_config_id": STR,
        "billing": {"type": "string", "enum": ["catalog", "gpu_time"]},
        "pricing": nullable(PRICES),
        "created_at": TIMESTAMP,
        "expires_at": TIMESTAMP,
        "in_progress_at": nullable(TIMESTAMP),
        "finalizing_at": nullable(TIMESTAMP),
        "cancelling_at": nullable(TIMESTAMP),
        "completed_at": nullable(TIMESTAMP),
        "cancelled_at": nullable(TIMESTAMP),
        "failed_at": nullable(TIMESTAMP),
        "expired_at": nullable(TIMESTAMP),
        "errors": nullable({"type": "object"}),
        "metadata": nullable({"type": "object"}),
        "usage": nullable({"type": "object"}),
        "charge_microusd": DECIMAL,
    },
}

# A payment rate: microusd per million tokens, a non-negative integer as a string.
_RATE = {"type": "string", "pattern": "^(0|[1-9][0-9]{0,17})$"}

# `metadata` takes only the BatchRouter assignment fields (batches.batchrouter), each checked
# when the body is parsed. What a schema cannot say is in the descriptions: the deadline must
# be in the future, the work unit id's limit is in UTF-8 bytes, and the rates and the input
# format must match the model and the file (checked once the file is found).
BATCH_METADATA: Schema = nullable(
    {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            WORK_UNIT_ID: {
                "type": "string",
                "minLength": 1,
                "maxLength": 128,
                "description": "1 to 128 bytes of UTF-8",
            },
            DEADLINE: {
                "type": "string",
                "format": "date-time",
                "description": "RFC 3339 with an offset, in the future",
            },
            ASSIGNMENT_WINDOW: {
                "type": "string",
                # 1 to 12 digits, not all zeros, then a unit: '90s', '30m', '6h'.
                "pattern": "^(?=[0-9]*[1-9])[0-9]{1,12}[smh]$",
                "description": "a duration longer than zero; anything past 24h counts as 24h",
            },
            TIER: {"type": "string", "enum": list(TIERS)},
            ROLE: {"type": "string", "enum": list(ROLES)},
            INPUT_RATE: _RATE,
            CACHED_INPUT_RATE: _RATE,
            OUTPUT_RATE: _RATE,
            INPUT_FORMAT: {"type": "string", "enum": list(INPUT_FORMATS)},
        },
    }
)

BATCH_CREATE: Schema = {
    "type": "object",
    "required": ["input_file_id", "endpoint", "completion_window"],
    "additionalProperties": False,
    "properties": {
        "input_file_id": {"type": "string", "minLength": 1},
        "endpoint": {"type": "string", "enum": ["/v1/chat/completions"]},
        "completion_window": {"type": "string", "enum": ["24h"]},
        "metadata": BATCH_METADATA,
    },
}

ESTIMATE: Schema = {
    "type": "object",
    "required": ["request_count", "max_charge_microusd", "credit_sufficient"],
    "properties": {
        "object": STR,
        "input_file_id": STR,
        "model": STR,
        "model_config_id": STR,
        "billing": STR,
        "request_count": INT,
        "prompt_tokens": INT,
        "max_output_tokens": INT,
        "max_charge_microusd": DECIMAL,
        "available_credit_microusd": DECIMAL,
        "credit_sufficient": {"type": "boolean"},
    },
}

RECEIPT: Schema = {
    "type": "object",
    "required": ["id", "object", "batch_id", "custom_id", "status_code"],
    "properties": {
        "id": STR,
        "object": {"type": "string", "enum": ["request.receipt"]},
        "batch_id": STR,
        "custom_id": STR,
        "model_config_id": STR,
        "status_code": nullable(INT),
        "error_code": nullable(STR),
        "usage": {"type": "object"},
        "billing": STR,
        "charge_microusd": DECIMAL,
        "created_at": TIMESTAMP,
        "completed_at": nullable(TIMESTAMP),
    },
}
