"""The OpenAPI schema at /v1/openapi.json and the server agree (schemathesis, live server).

Every request that is valid per the schema is accepted (no 4xx but auth, a random id's 404 and
an idempotency conflict), every invalid one is refused, every answer matches the schema, and
nothing answers 5xx. What OpenAPI cannot say is in tests/api/schemathesis_hooks.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests
import schemathesis

from batches.execution import serve_key
from batches.lifecycle import batch_finalize
from batches.models import Batch
from batches.queue import EngineKey
from tests.conftest import Tenant, jsonl, request_line

pytestmark = pytest.mark.django_db(transaction=True)

# Bounded, so CI stays well inside its time; seeded and deterministic, so every run sends
# the same requests.
MAX_EXAMPLES = 25
SEED = 29
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")


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
        "/v1/chat/completions",
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
    # There is no file list: GET /v1/files answers 405, so the schema does not offer it.
    assert set(schema["paths"]["/v1/files"]) == {"post"}


def _world(tenant: Tenant) -> dict[str, list[str]]:
    """Real ids for the generated requests to use alongside random ones: a completed batch
    (output file, receipts), one in progress (to cancel), a spare file (to delete) and a
    webhook endpoint."""
    api = tenant.api
    ids: dict[str, list[str]] = {"file_ids": [], "batch_ids": [], "request_ids": []}
    for n in range(2):
        file_id = api.upload(jsonl(request_line("a"), request_line("b"))).json()["id"]
        batch = api.post(
            "/v1/batches",
            {
                "input_file_id": file_id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
            HTTP_IDEMPOTENCY_KEY=f"world-{n}",
        ).json()
        ids["file_ids"].append(file_id)
        ids["batch_ids"].append(batch["id"])
    done = Batch.objects.get(id=ids["batch_ids"][0])
    serve_key(EngineKey(done.revision_id, done.deployment_id or ""))
    done = batch_finalize(batch_id=done.id)
    assert done is not None and done.status == Batch.Status.COMPLETED
    ids["file_ids"] += [done.output_file_id, api.upload(jsonl(request_line())).json()["id"]]
    receipts = api.get(f"/v1/requests?batch_id={done.id}").json()["data"]
    ids["request_ids"] = [r["id"] for r in receipts]
    assert len(ids["request_ids"]) == 2
    endpoint = api.post(
        "/v1/webhook_endpoints",
        {
            "name": "hook",
            "url": "https://hooks.example.com/boardwalk",
            "event_types": ["batch.completed"],
        },
    )
    assert endpoint.status_code == 200, endpoint.content
    ids["endpoint_ids"] = [endpoint.json()["id"]]
    return ids


def _config(ids: dict[str, list[str]], *, model: str, key: str) -> str:
    """schemathesis.toml: valid and invalid requests, checked both ways and every answer
    against the schema; real ids half the time, random ones otherwise."""
    config: dict[str, Any] = {
        "seed": SEED,
        "headers": {"Authorization": f"Bearer {key}"},
        "request-timeout": 30,
        "workers": 1,
        "suppress-health-check": ["all"],
        "warnings": False,
        "generation": {"mode": "all", "max-examples": MAX_EXAMPLES, "deterministic": True},
        # Only generated values and the ids below: values taken from earlier answers (an input
        # file that a batch already used, a batch id as a receipt cursor) break rules a schema
        # cannot state, and error feedback would steer generation away from refused requests,
        # hiding the very disagreements this test is for.
        "phases": {
            "examples": {"enabled": True, "extra-data-sources": {"responses": False}},
            "coverage": {"enabled": True, "extra-data-sources": {"responses": False}},
            "fuzzing": {
                "enabled": True,
                "extra-data-sources": {"responses": False},
                "error-feedback": {"enabled": False},
            },
            "stateful": {"enabled": False},
        },
        "checks": {
            "enabled": False,
            "not_a_server_error": {"enabled": True},
            "status_code_conformance": {"enabled": True},
            "content_type_conformance": {"enabled": True},
            "response_headers_conformance": {"enabled": True},
            "response_schema_conformance": {"enabled": True},
            # An invalid request is refused (4xx) ...
            "negative_data_rejection": {"enabled": True},
            # ... and a valid one is not, unless it meets a random id (404) or a reused
            # Idempotency-Key (409); nothing else but auth may refuse it.
            "positive_data_acceptance": {
                "enabled": True,
                "expected-statuses": ["2xx", "401", "403", "404", "409"],
            },
        },
        "dictionaries": {
            **{name: {"values": values} for name, values in ids.items()},
            "models": {"values": [model]},
            # A cursor must be an id of the list (400 invalid_cursor otherwise); empty is none.
            "batch_cursors": {"values": [*ids["batch_ids"], ""]},
            "request_cursors": {"values": [*ids["request_ids"], ""]},
            "endpoint_cursors": {"values": [*ids["endpoint_ids"], ""]},
        },
        "parameters": {
            "path.file_id": {"dictionary": "file_ids", "probability": 0.5},
            "path.batch_id": {"dictionary": "batch_ids", "probability": 0.5},
            "path.request_id": {"dictionary": "request_ids", "probability": 0.5},
            "path.name": {"dictionary": "models", "probability": 0.5},
            "query.batch_id": {"dictionary": "batch_ids", "probability": 0.5},
        },
        "operations": [
            {
                "include-name": "GET /v1/webhook_endpoints",
                "parameters": {
                    "query.after": {"dictionary": "endpoint_cursors", "probability": 1.0}
                },
            },
            # Only reads: the test operation would post to the endpoint's URL.
            {
                "include-name": "GET /v1/webhook_endpoints/{endpoint_id}",
                "parameters": {
                    "path.endpoint_id": {"dictionary": "endpoint_ids", "probability": 0.5}
                },
            },
            # Valid uploads get real JSONL from a map hook, which the coverage phase skips:
            # its uploads are the invalid ones (missing fields, wrong purpose, extra fields).
            {
                "include-name": "POST /v1/files",
                "phases": {"coverage": {"generation": {"mode": "negative"}}},
            },
            {
                "include-name": "GET /v1/batches",
                "parameters": {"query.after": {"dictionary": "batch_cursors", "probability": 1.0}},
            },
            {
                "include-name": "GET /v1/requests",
                "parameters": {
                    "query.after": {"dictionary": "request_cursors", "probability": 1.0}
                },
            },
        ],
    }
    return "".join(f"{json.dumps(key)} = {_toml(value)}\n" for key, value in config.items())


def _toml(value: Any) -> str:
    """TOML for the config: inline tables throughout (a JSON string is a TOML basic string)."""
    if isinstance(value, dict):
        pairs = [f"{json.dumps(key)} = {_toml(item)}" for key, item in value.items()]
        return "{" + ", ".join(pairs) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return json.dumps(value)  # str, int, bool


def test_schema_valid_requests_are_accepted_and_answered_as_described(
    live_server, tenant: Tenant, deployment, tmp_path: Path, settings
):
    settings.ITEM_LEASE_SECONDS = 900  # the batch runs in this thread: no heartbeat contention
    ids = _world(tenant)
    config = tmp_path / "schemathesis.toml"
    # A deployment's name: schemathesis draws no path value holding '/', as catalog names do.
    config.write_text(_config(ids, model=deployment.name, key=tenant.write_key))
    env: dict[str, Any] = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": str(HOOKS),
        "BOARDWALK_SCHEMATHESIS_UPLOAD": jsonl(request_line()).decode(),
    }
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("schemathesis")),
            "--config-file",
            str(config),
            "run",
            f"{live_server.url}/v1/openapi.json",
            "--url",
            live_server.url,
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]


def test_answers_the_generated_requests_do_not_reach_match_the_schema(
    live_server, tenant: Tenant, catalog_model
):
    # Generated batch bodies carry random file ids (404): a real file is the input of one
    # batch only, and its rates and format must match the model and the file. So the answers
    # of an upload, an estimate and a create are checked against the schema here.
    schema = schemathesis.openapi.from_url(f"{live_server.url}/v1/openapi.json")
    auth = {"Authorization": f"Bearer {tenant.write_key}"}
    upload = requests.post(
        f"{live_server.url}/v1/files",
        headers=auth,
        data={"purpose": "batch"},
        files={"file": ("requests.jsonl", jsonl(request_line()))},
        timeout=30,
    )
    assert upload.status_code == 200, upload.text
    schema["/v1/files"]["POST"].validate_response(upload)
    body = {
        "input_file_id": upload.json()["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "metadata": {"batchrouter_work_unit_id": "unit-1", "batchrouter_assignment_window": "6h"},
    }
    estimate = requests.post(
        f"{live_server.url}/v1/batches/estimate", headers=auth, json=body, timeout=30
    )
    assert estimate.status_code == 200, estimate.text
    schema["/v1/batches/estimate"]["POST"].validate_response(estimate)
    created = requests.post(
        f"{live_server.url}/v1/batches",
        headers={**auth, "Idempotency-Key": "answers-1"},
        json=body,
        timeout=30,
    )
    assert created.status_code == 200, created.text
    schema["/v1/batches"]["POST"].validate_response(created)
