"""The Files API with its content on S3 (moto's server, versioned bucket): a multipart upload,
range reads and a delete that leaves no version behind."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from files.models import File
from tests.conftest import Api, content_of, jsonl, request_line
from tests.files.conftest import S3Endpoint

pytestmark = pytest.mark.django_db

MARKER = "S3-PLAINTEXT-MARKER-51c2"
MULTIPART_THRESHOLD = 8 * 1024 * 1024  # boto3's default, which django-storages keeps


def test_large_input_is_uploaded_in_parts_and_served_by_ranges(
    api: Api, catalog_model: Any, settings: Any, s3_versioned_endpoint: S3Endpoint
):
    endpoint = s3_versioned_endpoint
    location = f"t-{uuid.uuid4().hex}"
    endpoint.use_for_content(settings, location=location)
    client = endpoint.client()
    filler = "lorem ipsum " * 800
    body = jsonl(
        *(request_line(f"task-{i}", content=f"{MARKER} {i} {filler}") for i in range(1000))
    )
    assert len(body) > MULTIPART_THRESHOLD + 1024 * 1024

    response = api.upload(body)
    assert response.status_code == 200, response.content
    file = File.objects.get(id=response.json()["id"])
    key = f"{location}/{file.storage_name}"
    head = client.head_object(Bucket=endpoint.bucket, Key=key)
    assert head["ContentLength"] == file.stored_bytes
    assert "-" in head["ETag"]  # an S3 multipart ETag: "<md5 of part md5s>-<parts>"
    stored = client.get_object(Bucket=endpoint.bucket, Key=key)["Body"].read()
    assert MARKER.encode() not in stored

    full = api.get(f"/v1/files/{file.id}/content")
    assert full.status_code == 200
    assert content_of(full) == body
    size = len(body)
    for header, start, end in [
        ("bytes=0-0", 0, 0),
        ("bytes=65530-65545", 65530, 65545),  # across an encryption chunk
        ("bytes=8300000-8500000", 8300000, 8500000),  # across the first multipart part
        (f"bytes={size - 100}-", size - 100, size - 1),
        ("bytes=-7", size - 7, size - 1),
    ]:
        part = api.get(f"/v1/files/{file.id}/content", HTTP_RANGE=header)
        assert part.status_code == 206, header
        assert part["Content-Range"] == f"bytes {start}-{end}/{size}"
        assert part["ETag"] == full["ETag"]
        assert content_of(part) == body[start : end + 1]

    assert api.delete(f"/v1/files/{file.id}").status_code == 200
    listing = client.list_object_versions(Bucket=endpoint.bucket, Prefix=f"{location}/")
    assert listing.get("Versions", []) == []
    assert listing.get("DeleteMarkers", []) == []
    assert api.get(f"/v1/files/{file.id}/content").status_code == 404
