"""The OpenAPI shapes of the files endpoints' answers and bodies (files.views)."""

from __future__ import annotations

from boardwalk.http.openapi import INT, STR, TIMESTAMP, Schema, nullable

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
        "expires_at": nullable(TIMESTAMP),
        "status_details": nullable(STR),
    },
}

# The upload form (POST /v1/files): these two fields, nothing else. The server reads the file part
# whatever its Content-Type and filename; its lines are checked as they stream
# (docs/API.md "Standard input lines").
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
