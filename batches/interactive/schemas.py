"""The OpenAPI shapes of `POST /v1/chat/completions` (batches.interactive.views).

The body is a batch row's `body` (files.validation.rules: docs/API.md lists every field and
rule), so the schema names the fields every request has and the interactive ones exactly,
and leaves the rest of the row's fields open rather than copying their rules here.
"""

from __future__ import annotations

from batches.interactive.service import SERVICE_TIERS
from boardwalk.http.openapi import INT, STR, TIMESTAMP, Schema, nullable

CHAT_COMPLETION_REQUEST: Schema = {
    "type": "object",
    "required": ["model", "messages"],
    "description": "A batch row's body (docs/API.md: every field, its rules and the model's "
    "context) plus stream, stream_options and service_tier. The model is resolved first: one "
    "that the organization cannot use is 404 model_not_found.",
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "messages": {"type": "array", "minItems": 1, "items": {"type": "object"}},
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "stream": nullable({"type": "boolean"}),
        "stream_options": nullable(
            {
                "type": "object",
                "description": "only with stream: true",
                "properties": {"include_usage": nullable({"type": "boolean"})},
                "additionalProperties": False,
            }
        ),
        "service_tier": nullable({"type": "string", "enum": list(SERVICE_TIERS)}),
    },
}


def _object(*required: str, **properties: Schema) -> Schema:
    return {"type": "object", "required": list(required), "properties": properties}


USAGE = _object(
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    prompt_tokens=INT,
    completion_tokens=INT,
    total_tokens=INT,
    prompt_tokens_details={"type": "object", "properties": {"cached_tokens": INT}},
    completion_tokens_details={"type": "object", "properties": {"reasoning_tokens": INT}},
)

CHOICE = _object(
    "index",
    "message",
    "finish_reason",
    index=INT,
    message={"type": "object", "required": ["role"]},
    finish_reason=STR,
    logprobs=nullable({"type": "object"}),
)

# OpenAI's fields, in its reference's order.
CHAT_COMPLETION: Schema = {
    "type": "object",
    "properties": {
        "choices": {"type": "array", "items": CHOICE},
        "created": TIMESTAMP,
        "id": STR,
        "model": STR,
        "object": {"type": "string", "enum": ["chat.completion"]},
        "service_tier": {"type": "string", "enum": ["default", "flex"]},
        "system_fingerprint": STR,  # the model_config_id that ran it
        "usage": USAGE,
    },
    "required": ["id", "object", "created", "model", "choices", "usage"],
}

EVENT_STREAM: Schema = {  # one server-sent event (stream: true)
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {
            "type": "string",
            "description": "a chat.completion.chunk as JSON, an error envelope, or [DONE] last "
            "(docs/API.md)",
        }
    },
}
