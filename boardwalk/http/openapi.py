"""OpenAPI 3 description of /v1 (drf-spectacular), served at /v1/openapi.json.

The views build their answers as plain dicts (one payload function per resource), so each
app writes their shapes once, as schemas (`<app>/schemas.py`, from the primitives here), and
attaches them to each operation with `operation()`. Every operation also documents the error
envelope (docs/API.md "Errors") for the statuses it can answer; schemathesis checks the live answers
against this in the test suite.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.renderers import OpenApiJsonRenderer
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from drf_spectacular.views import SpectacularAPIView
from rest_framework.permissions import AllowAny

from boardwalk.http.pagination import DEFAULT_LIMIT, MAX_LIMIT

__all__ = ["OpenApiParameter", "not_served", "operation"]

Schema = dict[str, Any]


def nullable(schema: Schema) -> Schema:
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
                "param": nullable(STR),
                "details": {"type": "array", "items": {"type": "object"}},
                "error_count": INT,
            },
        }
    },
}

DELETED: Schema = {
    "type": "object",
    "required": ["id", "object", "deleted"],
    "properties": {"id": STR, "object": STR, "deleted": {"type": "boolean"}},
}


def list_of(item: Schema) -> Schema:
    return {
        "type": "object",
        "required": ["object", "data", "first_id", "last_id", "has_more"],
        "properties": {
            "object": {"type": "string", "enum": ["list"]},
            "data": {"type": "array", "items": item},
            "first_id": nullable(STR),
            "last_id": nullable(STR),
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
    ok_content: dict[str, Schema] | None = None,
    summary: str | None = None,
    operation_id: str | None = None,
) -> Callable[[Any], Any]:
    """extend_schema for one operation: its 200 answer plus the error envelope.
    `ok_content`: a 200 answered in several content types, a schema each."""
    responses: dict[Any, Any] = {}
    if ok_content:
        for content_type, schema in ok_content.items():
            responses[(200, content_type)] = OpenApiResponse(response=schema)
    elif ok_content_type:
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
            "boardwalk.http.openapi.require_request_bodies",
        ]
    }

    scopes = {"GET": ()}  # deny-by-default walk: this view states it is open
    permission_classes = [AllowAny]
    renderer_classes = [OpenApiJsonRenderer]  # /openapi.json: JSON whatever Accept says
    authentication_classes = []  # type: ignore[var-annotated]
