"""OpenAPI 3 description of /v1 (drf-spectacular), served at /v1/openapi.json.

The views build their answers as plain dicts (one payload function per resource), so their
shapes are written here once, as schemas, and attached to each operation with `operation()`.
Every operation also documents the error envelope (SPEC §10) for the statuses it can answer;
schemathesis checks the live answers against this in the test suite.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.renderers import OpenApiJsonRenderer
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from drf_spectacular.views import SpectacularAPIView
from rest_framework.permissions import AllowAny

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
from boardwalk.pagination import DEFAULT_LIMIT, MAX_LIMIT

__all__ = ["OpenApiParameter", "not_served", "operation"]

Schema = dict[str, Any]


def _nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


INT = {"type": "integer"}
STR = {"type": "string"}
TIMESTAMP = {"type": "integer", "description": "Unix seconds"}
DECIMAL = {"type": "string", "pattern": "^-?[0-9]+$"}

ERROR: Schema = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["type", "code", "message", "param"],
            "properties": {
                "type": STR,
                "code": STR,
                "message": STR,
                "param": _nullable(STR),
                "details": {"type": "array", "items": {"type": "object"}},
                "error_count": INT,
            },
        }
    },
}

FILE: Schema = {
    "type": "object",
    "required": ["id", "object", "bytes", "filename", "purpose", "status", "created_at"],
    "properties": {
        "id": STR,
        "object": {"type": "string", "enum": ["file"]},
        "bytes": INT,
        "filename": STR,
        "purpose": {"type": "string", "enum": ["batch", "batch_output"]},
        "status": {"type": "string", "enum": ["processed", "deleted", "expired"]},
        "created_at": TIMESTAMP,
        "expires_at": _nullable(TIMESTAMP),
        "status_details": _nullable(STR),
    },
}

DELETED: Schema = {
    "type": "object",
    "required": ["id", "object", "deleted"],
    "properties": {"id": STR, "object": STR, "deleted": {"type": "boolean"}},
}

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
        "output_file_id": _nullable(STR),
        "error_file_id": _nullable(STR),
        "model_config_id": STR,
        "billing": {"type": "string", "enum": ["catalog", "gpu_time"]},
        "pricing": _nullable(PRICES),
        "created_at": TIMESTAMP,
        "expires_at": TIMESTAMP,
        "in_progress_at": _nullable(TIMESTAMP),
        "finalizing_at": _nullable(TIMESTAMP),
        "cancelling_at": _nullable(TIMESTAMP),
        "completed_at": _nullable(TIMESTAMP),
        "cancelled_at": _nullable(TIMESTAMP),
        "failed_at": _nullable(TIMESTAMP),
        "expired_at": _nullable(TIMESTAMP),
        "errors": _nullable({"type": "object"}),
        "metadata": _nullable({"type": "object"}),
        "usage": _nullable({"type": "object"}),
        "charge_microusd": DECIMAL,
    },
}

# A payment rate: microusd per million tokens, a non-negative integer as a string.
_RATE = {"type": "string", "pattern": "^(0|[1-9][0-9]{0,17})$"}

# `metadata` takes only the BatchRouter assignment fields (batches.batchrouter), each checked
# when the body is parsed. What a schema cannot say is in the descriptions: the deadline must
# be in the future, the work unit id's limit is in UTF-8 bytes, and the rates and the input
# format must match the model and the file (checked once the file is found).
BATCH_METADATA: Schema = _nullable(
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

# The upload form (POST /v1/files): these two fields, nothing else. The server reads the file
# part whatever its Content-Type and filename; its lines are checked as they stream (SPEC §4).
FILE_UPLOAD: Schema = {
    "type": "object",
    "required": ["purpose", "file"],
    "additionalProperties": False,
    "properties": {
        "purpose": {"type": "string", "enum": ["batch"]},
        "file": {
            "type": "string",
            "format": "binary",
            "description": "UTF-8 JSONL, one batch request per line: at most 256 MiB and "
            "1,000 lines, each line at most 20 MiB; a file with line errors is refused with "
            "400 invalid_input_file, every error in `details`",
        },
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
        "status_code": _nullable(INT),
        "error_code": _nullable(STR),
        "usage": {"type": "object"},
        "billing": STR,
        "charge_microusd": DECIMAL,
        "created_at": TIMESTAMP,
        "completed_at": _nullable(TIMESTAMP),
    },
}

MODEL: Schema = {
    "type": "object",
    "required": ["id", "object", "owned_by", "kind", "model_config_id", "modalities", "batch"],
    "properties": {
        "id": STR,
        "object": {"type": "string", "enum": ["model"]},
        "created": INT,
        "owned_by": STR,
        "kind": {"type": "string", "enum": ["catalog", "deployment"]},
        "model_config_id": STR,
        "modalities": {"type": "array", "items": STR},
        "context_length": INT,
        "batch": _nullable({"type": "object"}),
    },
}

_WEBHOOK_EVENT_TYPE = {
    "type": "string",
    "enum": ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"],
}
_WEBHOOK_ENDPOINT_PROPERTIES: Schema = {
    "id": STR,
    "object": {"type": "string", "enum": ["webhook_endpoint"]},
    "name": STR,
    "url": STR,
    "event_types": {"type": "array", "items": STR},
    "signing_secret_hint": _nullable(STR),
    "created_at": TIMESTAMP,
    "updated_at": TIMESTAMP,
}
_WEBHOOK_ENDPOINT_REQUIRED = ["id", "object", "name", "url", "event_types", "created_at"]

# The `openai` SDK's WebhookEndpoint and WebhookEndpointWithSecret (SPEC §10b).
WEBHOOK_ENDPOINT: Schema = {
    "type": "object",
    "required": _WEBHOOK_ENDPOINT_REQUIRED,
    "properties": _WEBHOOK_ENDPOINT_PROPERTIES,
}

WEBHOOK_ENDPOINT_WITH_SECRET: Schema = {
    "type": "object",
    "required": [*_WEBHOOK_ENDPOINT_REQUIRED, "signing_secret"],
    "properties": {
        **_WEBHOOK_ENDPOINT_PROPERTIES,
        "signing_secret": {
            "type": "string",
            "description": "whsec_…; only from create and rotate_secret.",
        },
    },
}

# What the server takes, as far as a schema can say it (webhooks.services checks the rest:
# the url's host must parse, and a non-https url must be a BOARDWALK_OUTBOUND_ALLOW target).
_WEBHOOK_NAME = {
    "type": "string",
    "minLength": 1,
    "maxLength": 128,
    "pattern": r"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$",
    "description": "not blank, no control characters",
}
_WEBHOOK_URL = {
    "type": "string",
    "minLength": 1,
    "maxLength": 2048,
    "pattern": r"^https://[a-z0-9]+(\.[a-z0-9]+)*(/[A-Za-z0-9._~-]*)*$",
    "description": "https, no credentials, no whitespace or control characters anywhere",
}

WEBHOOK_ENDPOINT_CREATE: Schema = {
    "type": "object",
    "required": ["name", "url", "event_types"],
    "additionalProperties": False,
    "description": "At most 16 endpoints per organization (then 409 too_many_webhook_endpoints).",
    "properties": {
        "name": _WEBHOOK_NAME,
        "url": _WEBHOOK_URL,
        "event_types": {"type": "array", "minItems": 1, "items": _WEBHOOK_EVENT_TYPE},
    },
}

WEBHOOK_ENDPOINT_UPDATE: Schema = {
    **WEBHOOK_ENDPOINT_CREATE,
    "required": [],
    "description": "Any of the fields; event_types replaces the whole set.",
}

WEBHOOK_ROTATE_SECRET: Schema = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"keep_old_secret_active_for_24_hours": {"type": "boolean"}},
}

WEBHOOK_TEST: Schema = {
    "type": "object",
    "required": ["event_type"],
    "additionalProperties": False,
    "properties": {"event_type": _WEBHOOK_EVENT_TYPE},
}

WEBHOOK_ENDPOINT_TEST_RESULT: Schema = {
    "type": "object",
    "required": ["object", "webhook_endpoint_id", "event_type", "status_code", "success"],
    "properties": {
        "object": {"type": "string", "enum": ["webhook_endpoint.test"]},
        "webhook_endpoint_id": STR,
        "event_type": STR,
        "status_code": INT,
        "success": {"type": "boolean", "enum": [True]},
    },
}

WEBHOOK_ENDPOINT_DELETED: Schema = {
    "type": "object",
    "required": ["id", "object", "deleted"],
    "properties": {
        "id": STR,
        "object": {"type": "string", "enum": ["webhook_endpoint.deleted"]},
        "deleted": {"type": "boolean"},
    },
}

WEBHOOK_EVENT_TYPE_LIST: Schema = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": {"type": "array", "items": STR},
    },
}


def list_of(item: Schema) -> Schema:
    return {
        "type": "object",
        "required": ["object", "data", "first_id", "last_id", "has_more"],
        "properties": {
            "object": {"type": "string", "enum": ["list"]},
            "data": {"type": "array", "items": item},
            "first_id": _nullable(STR),
            "last_id": _nullable(STR),
            "has_more": {"type": "boolean"},
        },
    }


PAGINATION = [
    OpenApiParameter(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
        description=f"1 to {MAX_LIMIT}, default {DEFAULT_LIMIT}; an empty value is refused",
    ),
    OpenApiParameter(
        "after",
        str,
        description="cursor: the last id of the previous page; an id this list does not hold "
        "is refused (400 invalid_cursor)",
    ),
]
IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    {"type": "string", "minLength": 1, "maxLength": 256},
    OpenApiParameter.HEADER,
    required=True,
    description="1 to 256 bytes of UTF-8",
)

_ERROR_TEXT = {
    400: "Invalid request",
    401: "No or bad API key",
    402: "Insufficient credit",
    403: "Missing scope",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Upload too large",
    415: "Unsupported media type",
    416: "Range not satisfiable",
    429: "Capacity limit",
    503: "Unavailable, retry later",
}
_ALWAYS = (400, 401, 403, 404, 405)


def not_served() -> Callable[[Any], Any]:
    """For a method a view answers only to explain that it is not served (405 with a hint):
    left out of the schema, which describes what the server does."""
    return extend_schema(exclude=True)


def operation(
    ok: Schema | None,
    *,
    errors: tuple[int, ...] = (),
    request: Any = None,
    parameters: list[OpenApiParameter] | None = None,
    ok_content_type: str | None = None,
    summary: str | None = None,
    operation_id: str | None = None,
) -> Callable[[Any], Any]:
    """extend_schema for one operation: its 200 answer plus the error envelope."""
    responses: dict[Any, Any] = {}
    if ok_content_type:
        responses[(200, ok_content_type)] = OpenApiResponse(description="the file's bytes")
        responses[(206, ok_content_type)] = OpenApiResponse(description="the requested range")
    else:
        responses[200] = ok
    for status in sorted(set(_ALWAYS) | set(errors)):
        responses[status] = OpenApiResponse(response=ERROR, description=_ERROR_TEXT[status])
    if isinstance(request, dict) and "type" in request:
        request = {"application/json": request}
    return extend_schema(
        request=request,
        responses=responses,
        parameters=parameters or [],
        summary=summary,
        operation_id=operation_id,
    )


def require_request_bodies(result: Schema, generator: Any, request: Any, public: bool) -> Schema:
    """Postprocessing hook: a body whose schema has required fields is itself required.

    drf-spectacular marks the raw-dict bodies of `operation(request=...)` optional; the server
    refuses a request without one (400 or 415), so the schema says it is required."""
    for operations in result.get("paths", {}).values():
        for described in operations.values():
            body = described.get("requestBody")
            if body and any(m.get("schema", {}).get("required") for m in body["content"].values()):
                body["required"] = True
    return result


class OpenApiView(SpectacularAPIView):
    """Public: a client generator needs no key. The schema holds no tenant data."""

    custom_settings = {
        "POSTPROCESSING_HOOKS": [
            "drf_spectacular.hooks.postprocess_schema_enums",
            "boardwalk.openapi.require_request_bodies",
        ]
    }

    scopes = {"GET": ()}  # deny-by-default walk: this view states it is open
    permission_classes = [AllowAny]
    renderer_classes = [OpenApiJsonRenderer]  # /openapi.json: JSON whatever Accept says
    authentication_classes = []  # type: ignore[var-annotated]
