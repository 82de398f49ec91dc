"""The OpenAPI schema at /v1/openapi.json matches the real answers (schemathesis, live server)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import Tenant, jsonl, request_line

pytestmark = pytest.mark.django_db(transaction=True)

# Bounded, so CI stays well inside its time: a few generated cases per operation.
MAX_EXAMPLES = 5


def test_schema_is_public_openapi_3_and_documents_every_endpoint(client):
    response = client.get("/v1/openapi.json")
    assert response.status_code == 200
    assert response["Content-Type"].split(";")[0].endswith("json")
    schema = orjson.loads(response.content)
    assert schema["openapi"].startswith("3.")
    paths = set(schema["paths"])
    for path in (
        "/v1/files",
        "/v1/files/{file_id}",
        "/v1/files/{file_id}/content",
        "/v1/batches",
        "/v1/batches/estimate",
        "/v1/batches/{batch_id}",
        "/v1/batches/{batch_id}/cancel",
        "/v1/requests",
        "/v1/requests/{request_id}",
        "/v1/models",
        "/v1/models/{name}",
        "/v1/webhook_endpoints",
        "/v1/webhook_endpoints/{endpoint_id}",
        "/v1/webhook_endpoints/{endpoint_id}/rotate_secret",
        "/v1/webhook_endpoints/{endpoint_id}/test",
        "/v1/webhook_event_types",
    ):
        assert path in paths, path
        for operation in schema["paths"][path].values():
            error = operation["responses"]["404"]["content"]["application/json"]["schema"]
            assert error["required"] == ["error"]  # the envelope, on every operation


def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    live_server, tenant: Tenant, catalog_model, tmp_path: Path
):
    # Something real to find: a file and a batch of this org.
    file_id = tenant.api.upload(jsonl(request_line())).json()["id"]
    tenant.api.post(
        "/v1/batches",
        {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        HTTP_IDEMPOTENCY_KEY="st",
    )
    env: dict[str, Any] = {**os.environ, "SCHEMATHESIS_HOOKS": ""}
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("schemathesis")),
            "run",
            f"{live_server.url}/v1/openapi.json",
            "--url",
            live_server.url,
            "--checks",
            "not_a_server_error,response_schema_conformance",
            "--phases",
            "examples,fuzzing",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--seed",
            "1",
            "--request-timeout",
            "30",
            "--header",
            f"Authorization: Bearer {tenant.write_key}",
            "--suppress-health-check",
            "all",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
