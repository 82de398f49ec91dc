"""Result files are stored twice; reads fall back to the recovery copy; deletes leave nothing.

Run over a local directory, a plain S3 bucket and a versioned one (moto's server).
"""

from __future__ import annotations

import pytest

from files.crypto import CHUNK_SIZE, READ_GROUP_CHUNKS, STORED_CHUNK_SIZE
from files.models import File
from files.services import file_publish_result
from tests.conftest import Tenant, content_of
from tests.files.conftest import Backend

pytestmark = pytest.mark.django_db

MARKER = b"RESULT-MARKER-0c41"


def result_rows(count: int = 3000) -> list[bytes]:
    return [b'{"custom_id":"task-%d","note":"%s"}\n' % (i, MARKER) for i in range(count)]


def publish(tenant: Tenant, rows: list[bytes], file_id: str = "file-result1") -> File:
    return file_publish_result(
        org=tenant.org, file_id=file_id, rows=rows, filename=f"{file_id}.jsonl"
    )


def download(tenant: Tenant, file_id: str, **headers: str):
    return tenant.api.get(f"/v1/files/{file_id}/content", **headers)


def test_a_result_file_is_stored_twice_byte_identical(any_backend: Backend, tenant: Tenant):
    file = publish(tenant, result_rows())
    assert file.recovery_name and file.recovery_name != file.storage_name
    assert file.recovery_name.split("/")[0] != file.storage_name.split("/")[0]  # other prefix
    assert sorted([file.storage_name, file.recovery_name]) == any_backend.keys()
    primary = any_backend.raw(file.storage_name)
    assert any_backend.raw(file.recovery_name) == primary
    assert MARKER not in primary


@pytest.mark.parametrize("damage", ["missing", "flipped byte", "truncated"])
def test_download_falls_back_to_the_recovery_copy(
    any_backend: Backend, tenant: Tenant, damage: str, caplog: pytest.LogCaptureFixture
):
    rows = result_rows(30_000)
    body = b"".join(rows)
    assert len(body) > (READ_GROUP_CHUNKS + 2) * CHUNK_SIZE
    file = publish(tenant, rows)
    before = download(tenant, file.id)
    assert content_of(before) == body

    raw = bytearray(any_backend.raw(file.storage_name))
    if damage == "missing":
        any_backend.remove(file.storage_name)
    elif damage == "flipped byte":
        # A chunk of the second read group: the first group was sent from the primary.
        raw[(READ_GROUP_CHUNKS + 1) * STORED_CHUNK_SIZE + 10] ^= 0x01
        any_backend.put(file.storage_name, bytes(raw))
    else:
        any_backend.put(file.storage_name, bytes(raw[: -STORED_CHUNK_SIZE // 2]))

    after = download(tenant, file.id)
    assert after.status_code == 200
    assert after["ETag"] == before["ETag"]
    assert content_of(after) == body
    ranged = download(tenant, file.id, HTTP_RANGE=f"bytes={CHUNK_SIZE - 5}-")
    assert ranged.status_code == 206
    assert content_of(ranged) == body[CHUNK_SIZE - 5 :]
    assert "the primary copy is unreadable" in caplog.text
    if damage == "flipped byte":  # every chunk before the damaged one came from the primary
        assert f"unreadable at byte {(READ_GROUP_CHUNKS + 1) * CHUNK_SIZE}:" in caplog.text
    assert MARKER.decode() not in caplog.text


def test_both_copies_lost_is_a_clean_503(any_backend: Backend, tenant: Tenant):
    file = publish(tenant, result_rows(10))
    any_backend.remove(file.storage_name)
    any_backend.remove(file.recovery_name)
    response = download(tenant, file.id)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "content_unavailable"
    assert error["type"] == "server_error"
    assert file.id in error["message"]
    assert file.storage_name not in error["message"]  # no storage layout in client messages
    # Metadata still answers.
    assert tenant.api.get(f"/v1/files/{file.id}").json()["status"] == "processed"


def test_deleting_a_result_file_removes_every_copy_and_version(
    any_backend: Backend, tenant: Tenant
):
    file = publish(tenant, result_rows(100))
    # Rewrite the primary once more: on a versioned bucket that is a second version.
    any_backend.put(file.storage_name, any_backend.raw(file.storage_name))
    if any_backend.kind == "s3-versioned":
        assert any_backend.versions().count(file.storage_name) == 2

    response = tenant.api.delete(f"/v1/files/{file.id}")
    assert response.status_code == 200
    file.refresh_from_db()
    assert file.wrapped_key is None
    assert file.stored_bytes == 0
    assert any_backend.keys() == []
    assert any_backend.versions() == []  # no version and no delete marker left
    assert download(tenant, file.id).status_code == 404


def test_a_failed_blob_delete_still_deletes_and_the_sweep_finishes_it(
    any_backend: Backend, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
):
    from batches.retention import retention_sweep

    file = publish(tenant, result_rows(100))
    store_type = type(any_backend.store)

    def broken(self: object, name: str) -> None:
        raise OSError("storage is down")

    with monkeypatch.context() as patch:
        patch.setattr(store_type, "delete", broken)
        response = tenant.api.delete(f"/v1/files/{file.id}")
    assert response.status_code == 200
    file.refresh_from_db()
    assert file.status == "deleted" and file.wrapped_key is None  # unreadable already
    assert len(any_backend.keys()) == 2

    assert retention_sweep().leftover_blobs == 1
    assert any_backend.versions() == []
    assert retention_sweep().leftover_blobs == 0
