"""Bounded request parsing: body size, chunked bodies, nesting, 401 challenge,
Idempotency-Key bytes. Each sends the bad thing and checks that nothing was created."""

from __future__ import annotations

from typing import Any

import pytest

from batches.models import Batch, IdempotencyRecord
from billing.models import LedgerEntry
from tests.conftest import Api, Tenant

pytestmark = pytest.mark.django_db


def _submission(file_id: str = "file-missing") -> dict[str, Any]:
    return {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }


def _raw_post(api: Api, path: str, body: bytes, **extra: str) -> Any:
    return api.client.generic(
        "POST",
        path,
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api.key}",
        **extra,
    )


def _nothing_created() -> None:
    assert not Batch.objects.exists()
    assert not IdempotencyRecord.objects.exists()
    assert not LedgerEntry.objects.filter(kind="hold").exists()


def test_20_mib_json_body_on_create_is_413_in_the_envelope(api: Api):
    body = b'{"metadata": {"x": "' + b"a" * (20 * 1024 * 1024) + b'"}}'
    response = _raw_post(api, "/v1/batches", body, HTTP_IDEMPOTENCY_KEY="big")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert response["x-should-retry"] == "false"
    _nothing_created()


def test_chunked_body_is_411_with_a_clear_message(api: Api):
    response = _raw_post(
        api, "/v1/batches", b"{}", HTTP_IDEMPOTENCY_KEY="k", HTTP_TRANSFER_ENCODING="chunked"
    )
    assert response.status_code == 411
    error = response.json()["error"]
    assert error["code"] == "length_required"
    assert "Content-Length" in error["message"]
    _nothing_created()


@pytest.mark.parametrize("path", ["/v1/batches", "/v1/batches/estimate"])
def test_deeply_nested_json_body_is_400_not_a_500(api: Api, path: str):
    body = b"[" * 100_000 + b"]" * 100_000
    response = _raw_post(api, path, body, HTTP_IDEMPOTENCY_KEY="deep")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"
    # Deep enough to pass orjson (1,024 levels) but not the body limit.
    body = b'{"metadata": ' + b'{"a": ' * 100 + b"1" + b"}" * 100 + b"}"
    response = _raw_post(api, path, body, HTTP_IDEMPOTENCY_KEY="deep")
    assert response.status_code == 400
    assert "nests" in response.json()["error"]["message"]
    _nothing_created()


def test_huge_number_in_a_json_body_is_400(api: Api):
    response = _raw_post(api, "/v1/batches/estimate", b'{"input_file_id": ' + b"9" * 5000 + b"}")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("authorization", [None, "Bearer bw_not_a_key", "Basic abc"])
def test_401_carries_a_bearer_challenge(api: Api, authorization: str | None):
    headers = {"HTTP_AUTHORIZATION": authorization} if authorization else {}
    response = api.client.get("/v1/batches", **headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def _wsgi_header(text: str) -> str:
    # What a WSGI server hands Django: the header's bytes decoded as latin-1.
    return text.encode().decode("latin-1")


def test_idempotency_key_length_is_counted_in_utf8_bytes(api: Api, tenant: Tenant):
    # 128 times "é" is 256 bytes in UTF-8: within the limit, so the request gets past the key
    # check (and fails on the missing file instead).
    response = api.post("/v1/batches", _submission(), HTTP_IDEMPOTENCY_KEY=_wsgi_header("é" * 128))
    assert response.status_code in (400, 404)
    assert response.json()["error"]["code"] != "invalid_idempotency_key", response.content
    response = api.post("/v1/batches", _submission(), HTTP_IDEMPOTENCY_KEY=_wsgi_header("é" * 129))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_idempotency_key"
    assert "258" in error["message"]
    _nothing_created()


def test_idempotency_key_that_is_not_utf8_is_refused(api: Api):
    response = api.post("/v1/batches", _submission(), HTTP_IDEMPOTENCY_KEY="\xff\xfe")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_idempotency_key"


def test_a_body_read_that_times_out_is_408_not_500(api: Api):
    class Stalled:
        def read(self, *args: Any) -> bytes:
            raise TimeoutError("request body slower than 4096 bytes/s on average")

        readline = read

    response = api.client.generic(
        "POST",
        "/v1/batches/estimate",
        b"{}",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api.key}",
        **{"wsgi.input": Stalled()},
    )
    assert response.status_code == 408
    assert response.json()["error"]["code"] == "request_timeout"
    assert "x-should-retry" not in response
