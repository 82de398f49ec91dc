"""The Files API (docs/API.md "Files") over HTTP: upload, metadata, content with ranges, delete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from files.models import File
from files.storage import content_store
from tests.conftest import Api, Tenant, content_of, jsonl, request_line

pytestmark = pytest.mark.django_db

MARKER = "PLAINTEXT-MARKER-7f3a9"


def _body(api: Api) -> bytes:
    return jsonl(*(request_line(f"task-{i}", content=f"{MARKER} number {i}") for i in range(50)))


def test_upload_validates_stores_encrypted_and_answers_the_file_object(
    api: Api, catalog_model, tmp_path: Path
):
    body = _body(api)
    response = api.upload(body)
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["object"] == "file"
    assert data["id"].startswith("file-")
    assert data["bytes"] == len(body)
    assert data["purpose"] == "batch"
    assert data["status"] == "processed"
    assert data["filename"] != "requests.jsonl"  # server-assigned
    assert data["expires_at"] - data["created_at"] == 24 * 3600
    file = File.objects.get(id=data["id"])
    assert file.line_count == 50
    stored = (tmp_path / "content" / file.storage_name).read_bytes()
    assert MARKER.encode() not in stored
    assert len(stored) > len(body)


def test_content_roundtrip_with_etag_and_headers(api: Api, catalog_model):
    body = _body(api)
    file_id = api.upload(body).json()["id"]
    response = api.get(f"/v1/files/{file_id}/content", HTTP_ACCEPT="application/binary")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/jsonl"
    assert response["Accept-Ranges"] == "bytes"
    assert response["ETag"] == f'"{File.objects.get(id=file_id).sha256}"'
    assert content_of(response) == body
    again = api.get(f"/v1/files/{file_id}/content")
    assert again["ETag"] == response["ETag"]
    assert content_of(again) == body


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=10-", slice(10, None)),
        ("bytes=0-0", slice(0, 1)),
        ("bytes=100-70000", slice(100, 70001)),
        ("bytes=-25", slice(-25, None)),
        ("bytes=5-999999999", slice(5, None)),
    ],
)
def test_single_range_answers_206(api: Api, catalog_model, header: str, expected: slice):
    body = _body(api) * 1  # > 64 KiB would be nicer; cover chunk edges in test_storage
    file_id = api.upload(body).json()["id"]
    response = api.get(f"/v1/files/{file_id}/content", HTTP_RANGE=header)
    assert response.status_code == 206
    part = body[expected]
    assert content_of(response) == part
    start = (
        expected.start
        if expected.start is None or expected.start >= 0
        else len(body) + expected.start
    )
    start = start or 0
    assert response["Content-Range"] == f"bytes {start}-{start + len(part) - 1}/{len(body)}"
    assert response["Content-Length"] == str(len(part))


def test_range_across_encryption_chunks(api: Api, catalog_model):
    body = jsonl(*(request_line(f"t{i}", content="x" * 4000) for i in range(60)))
    assert len(body) > 3 * 65536
    file_id = api.upload(body).json()["id"]
    response = api.get(f"/v1/files/{file_id}/content", HTTP_RANGE="bytes=65530-131080")
    assert content_of(response) == body[65530:131081]


def test_if_range_match_gives_206_and_mismatch_gives_full_200(api: Api, catalog_model):
    body = _body(api)
    file_id = api.upload(body).json()["id"]
    etag = api.get(f"/v1/files/{file_id}")  # metadata has no etag; read it from content
    etag = api.get(f"/v1/files/{file_id}/content")["ETag"]
    ok = api.get(f"/v1/files/{file_id}/content", HTTP_RANGE="bytes=10-", HTTP_IF_RANGE=etag)
    assert ok.status_code == 206
    stale = api.get(f"/v1/files/{file_id}/content", HTTP_RANGE="bytes=10-", HTTP_IF_RANGE='"other"')
    assert stale.status_code == 200
    assert content_of(stale) == body
    weak = api.get(
        f"/v1/files/{file_id}/content", HTTP_RANGE="bytes=10-", HTTP_IF_RANGE="W/" + etag
    )
    assert weak.status_code == 200  # strong comparison only


def test_unsatisfiable_range_is_416_with_content_range(api: Api, catalog_model):
    body = _body(api)
    file_id = api.upload(body).json()["id"]
    response = api.get(f"/v1/files/{file_id}/content", HTTP_RANGE=f"bytes={len(body)}-")
    assert response.status_code == 416
    assert response["Content-Range"] == f"bytes */{len(body)}"
    assert response.json()["error"]["code"] == "range_not_satisfiable"


def test_unparseable_or_multi_range_is_ignored(api: Api, catalog_model):
    body = _body(api)
    file_id = api.upload(body).json()["id"]
    for header in ("bytes=0-1,5-6", "items=0-1", "bytes=9-3"):
        response = api.get(f"/v1/files/{file_id}/content", HTTP_RANGE=header)
        assert response.status_code == 200
        assert content_of(response) == body


def test_delete_destroys_key_and_content(api: Api, catalog_model, tmp_path: Path):
    file_id = api.upload(_body(api)).json()["id"]
    file = File.objects.get(id=file_id)
    response = api.delete(f"/v1/files/{file_id}")
    assert response.status_code == 200
    assert response.json() == {"id": file_id, "object": "file", "deleted": True}
    file.refresh_from_db()
    assert file.wrapped_key is None
    assert not content_store().exists(file.storage_name)
    assert api.get(f"/v1/files/{file_id}").json()["status"] == "deleted"
    content = api.get(f"/v1/files/{file_id}/content")
    assert content.status_code == 404
    assert api.delete(f"/v1/files/{file_id}").status_code == 200  # idempotent


def test_file_list_is_405(api: Api):
    response = api.get("/v1/files")
    assert response.status_code == 405
    assert "no file-list endpoint" in response.json()["error"]["message"]
    assert response["Allow"] == "POST, OPTIONS"
    assert api.client.head("/v1/files", HTTP_AUTHORIZATION=f"Bearer {api.key}").status_code == 405


def test_options_lists_only_the_methods_that_answer(api: Api):
    """OPTIONS /v1/files offers POST (and OPTIONS), not the GET that answers 405."""
    auth = {"HTTP_AUTHORIZATION": f"Bearer {api.key}"}
    response = api.client.options("/v1/files", **auth)
    assert response.status_code == 200
    assert response["Allow"] == "POST, OPTIONS"
    # The other file URLs list what they serve, GET among them.
    assert api.client.options("/v1/files/file-x", **auth)["Allow"] == "GET, DELETE, HEAD, OPTIONS"


def test_another_orgs_file_is_404_everywhere(api: Api, other_tenant: Tenant, catalog_model):
    file_id = api.upload(_body(api)).json()["id"]
    other = other_tenant.api
    for response in (
        other.get(f"/v1/files/{file_id}"),
        other.get(f"/v1/files/{file_id}/content"),
        other.delete(f"/v1/files/{file_id}"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    assert File.objects.get(id=file_id).wrapped_key is not None


def test_unknown_file_is_404(api: Api):
    assert api.get("/v1/files/file-doesnotexist").status_code == 404


def test_the_refusal_quotes_the_first_line_error_once(api: Api, catalog_model):
    response = api.upload(jsonl(request_line("a"), request_line("b", max_tokens=0)))
    error = response.json()["error"]
    first = error["details"][0]["message"]
    assert first.startswith("Line 2: ")
    assert error["message"] == f"The input file has 1 error(s); see details. First: {first}"
    assert File.objects.count() == 0


def test_bad_file_reports_every_line_and_stores_nothing(api: Api, catalog_model, tmp_path: Path):
    rows = [
        request_line("a"),
        request_line("a"),
        {"custom_id": "c"},
        request_line("d", max_tokens=0),
    ]
    body = jsonl(*rows) + b"\n" + b"not json\n"
    response = api.upload(body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_input_file"
    assert response["x-should-retry"] == "false"
    found = {(d["line"], d["code"]) for d in error["details"]}
    assert (2, "duplicate_custom_id") in found
    assert (3, "missing_field") in found
    assert (4, "invalid_max_tokens") in found
    assert (5, "blank_line") in found
    assert (6, "invalid_json") in found
    assert all(set(d) == {"line", "field", "code", "message"} for d in error["details"])
    assert File.objects.count() == 0
    assert not any((tmp_path / "content").rglob("*.enc"))


def test_error_details_are_capped_at_100_with_a_count(api: Api, catalog_model):
    body = b"".join(b"{}\n" for _ in range(150))
    error = api.upload(body).json()["error"]
    assert len(error["details"]) == 100
    assert error["error_count"] >= 150


def test_unknown_model_is_an_upload_error(api: Api, catalog_model):
    response = api.upload(jsonl(request_line(model="nope/model")))
    detail = response.json()["error"]["details"][0]
    assert (detail["line"], detail["field"], detail["code"]) == (1, "body.model", "model_not_found")


def test_another_orgs_deployment_is_unknown(api: Api, other_tenant: Tenant, deployment):
    response = other_tenant.api.upload(jsonl(request_line(model=deployment.name)))
    assert response.json()["error"]["details"][0]["code"] == "model_not_found"
    assert api.upload(jsonl(request_line(model=deployment.name))).status_code == 200


def test_catalog_model_without_batch_is_refused(api: Api, catalog_model):
    catalog_model.batch_enabled = False
    catalog_model.save()
    response = api.upload(jsonl(request_line()))
    assert response.json()["error"]["details"][0]["code"] == "model_not_batch_enabled"


def test_max_tokens_over_context_is_refused(api: Api, catalog_model):
    limit = catalog_model.revision.context_length
    response = api.upload(jsonl(request_line(max_tokens=limit + 1)))
    assert response.json()["error"]["details"][0]["code"] == "max_tokens_exceeds_context"


def test_image_part_refused_where_model_publishes_no_images(api: Api, catalog_model):
    line = request_line()
    line["body"]["messages"][0]["content"] = [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    ]
    detail = api.upload(jsonl(line)).json()["error"]["details"][0]
    assert detail["code"] == "unsupported_modality"


@pytest.mark.parametrize(
    "host", ["exa mple.com", "exa\tmple.com", "exa\nmple.com", "exa\x00mple.com"]
)
def test_an_image_url_whose_host_holds_whitespace_or_nul_is_refused_at_upload(
    api: Api, vision_model, host: str
):
    def upload(url: str) -> Any:
        line = request_line(model=vision_model.name)
        line["body"]["messages"][0]["content"] = [
            {"type": "text", "text": "what is it?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        return api.upload(jsonl(line))

    response = upload(f"https://{host}/cat.png")
    assert response.status_code == 400
    detail = response.json()["error"]["details"][0]
    assert (detail["line"], detail["code"]) == (1, "invalid_image_url")
    assert detail["field"] == "body.messages[0].content[1].image_url.url"
    assert File.objects.count() == 0
    assert upload("https://example.com/cat.png").status_code == 200  # the same, well formed


def test_missing_purpose_or_file_or_extra_fields_are_400(api: Api, catalog_model):
    body = jsonl(request_line())
    assert api.upload(body, purpose=None).json()["error"]["code"] == "missing_purpose"
    assert api.upload(body, purpose="fine-tune").json()["error"]["code"] == "invalid_purpose"
    response = api.upload(body, extra={"expires_after[anchor]": "created_at"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "expires_after[anchor]"
    missing = api.client.post(
        "/v1/files",
        {"purpose": "batch"},
        format="multipart",
        HTTP_AUTHORIZATION=f"Bearer {api.key}",
    )
    assert missing.json()["error"]["code"] == "missing_file"
    assert File.objects.count() == 0


def test_json_body_instead_of_multipart_is_415(api: Api):
    response = api.post("/v1/files", {"purpose": "batch"})
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"


def test_too_many_lines_is_refused(api: Api, catalog_model):
    body = jsonl(*(request_line(f"t{i}", max_tokens=1, content="x") for i in range(1001)))
    error = api.upload(body).json()["error"]
    assert error["details"][0]["code"] == "too_many_lines"
    assert File.objects.count() == 0


def test_file_over_256_mib_is_413(api: Api, catalog_model, settings, monkeypatch):
    monkeypatch.setattr("files.upload.MAX_INPUT_BYTES", 4096)
    monkeypatch.setattr("files.services.writes.MAX_INPUT_BYTES", 4096)
    body = jsonl(*(request_line(f"t{i}") for i in range(100)))
    response = api.upload(body)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "file_too_large"
    assert File.objects.count() == 0


def test_line_over_20_mib_is_refused(api: Api, catalog_model, monkeypatch):
    monkeypatch.setattr("files.upload.MAX_LINE_BYTES", 1000)
    body = jsonl(request_line("a"), request_line("b", content="y" * 2000))
    detail = api.upload(body).json()["error"]["details"][0]
    assert (detail["line"], detail["code"]) == (2, "line_too_large")


def test_retained_input_over_1_gib_is_429(api: Api, catalog_model, monkeypatch):
    body = jsonl(request_line())
    monkeypatch.setattr("files.services.writes.MAX_RETAINED_INPUT_BYTES", len(body) * 2)
    assert api.upload(body).status_code == 200
    assert api.upload(body).status_code == 200
    response = api.upload(body)
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "retained_input_limit"
    assert "Retry-After" in response
    assert File.objects.count() == 2


def test_upload_error_messages_never_echo_content(api: Api, catalog_model):
    line = request_line(content=MARKER)
    line["body"]["temperature"] = MARKER
    response = api.upload(jsonl(line))
    assert MARKER not in response.content.decode()
    assert orjson.loads(response.content)["error"]["details"][0]["field"] == "body.temperature"
