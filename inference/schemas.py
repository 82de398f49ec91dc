"""The OpenAPI shape of a model (inference.views)."""

from __future__ import annotations

from boardwalk.http.openapi import INT, STR, Schema, nullable

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
        "batch": nullable({"type": "object"}),
    },
}
