"""The OpenAPI shapes of the webhook endpoints (webhooks.views)."""

from __future__ import annotations

from boardwalk.http.openapi import INT, STR, TIMESTAMP, Schema, nullable

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
    "signing_secret_hint": nullable(STR),
    "created_at": TIMESTAMP,
    "updated_at": TIMESTAMP,
}
_WEBHOOK_ENDPOINT_REQUIRED = ["id", "object", "name", "url", "event_types", "created_at"]

# The `openai` SDK's WebhookEndpoint and WebhookEndpointWithSecret (docs/API.md "Webhooks").
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
