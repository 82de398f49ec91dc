"""Schemathesis hooks for tests/api/test_openapi.py: the two rules of /v1 that OpenAPI cannot
state, applied to the generated valid requests so that "valid per the schema" means acceptable.

Both are written in the schema's descriptions too; everything else a request holds is sent as
generated, and a negative case is never touched (it must be refused for what it breaks).
Loaded by the schemathesis process (SCHEMATHESIS_HOOKS), not by pytest.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import schemathesis

# The test puts a valid upload (JSONL batch requests for a model it created) here.
UPLOAD_ENV = "BOARDWALK_SCHEMATHESIS_UPLOAD"
DEADLINE = "batchrouter_deadline"
BATCH_BODIES = {"/v1/batches", "/v1/batches/estimate"}


@schemathesis.hook("map_body").apply_to(path="/v1/files", method="POST")
def upload_batch_requests(context: Any, body: Any) -> Any:
    """The file part's bytes must be JSONL batch requests naming a model the org can use; a
    schema can only say `format: binary` (tests/files covers the line checks).

    A map hook, applied as the fuzzing phase generates a positive case: editing a binary body
    later (before_call) makes schemathesis re-judge it invalid. The coverage phase runs no map
    hook, so the test gives it only negative uploads."""
    if isinstance(body, dict) and "file" in body:
        body = {**body, "file": os.environ[UPLOAD_ENV].encode()}
    return body


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """`format: date-time` says RFC 3339; "in the future" depends on the clock, so a past
    deadline is moved to a year from now, the rest of the metadata kept as generated. Here,
    where every phase passes, and only for valid cases."""
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return
    if case.method.upper() != "POST" or case.operation.path not in BATCH_BODIES:
        return
    metadata = case.body.get("metadata") if isinstance(case.body, dict) else None
    if not isinstance(metadata, dict) or not isinstance(metadata.get(DEADLINE), str):
        return
    try:
        deadline = dt.datetime.fromisoformat(metadata[DEADLINE].upper())
    except ValueError:
        return  # sent as generated: if the server refuses it, schema and server disagree
    now = dt.datetime.now(dt.UTC)
    if deadline.tzinfo is not None and deadline <= now:
        future = (now + dt.timedelta(days=365)).isoformat().replace("+00:00", "Z")
        case.body = {**case.body, "metadata": {**metadata, DEADLINE: future}}
