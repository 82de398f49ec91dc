"""`manage.py rotate_master_key`: data keys re-wrapped under the new master key, content
untouched, the old key removable afterwards, and a rerun a no-op."""

from __future__ import annotations

import base64
import io
import json
import secrets
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from batches.models import Batch
from files.models import File
from tests.batches.conftest import finalize, rows, run_worker, submit
from tests.conftest import Api, content_of, jsonl, request_line

pytestmark = pytest.mark.django_db


def master_key(key_id: str) -> str:
    return f"{key_id}:{base64.b64encode(secrets.token_bytes(32)).decode()}"


def rotate(*args: str) -> dict[str, Any]:
    out = io.StringIO()
    call_command("rotate_master_key", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def stored_blobs(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_rotation_rewraps_files_and_batches_and_the_old_key_can_go(
    api: Api, catalog_model: Any, settings: Any, tmp_path: Path
):
    old, new = master_key("2025-old"), master_key("2026-new")
    settings.MASTER_KEYS = old
    spare = jsonl(request_line("kept"))
    spare_id = api.upload(spare).json()["id"]
    data = submit(api, rows(2))
    deleted_id = api.upload(jsonl(request_line("gone"))).json()["id"]
    assert api.delete(f"/v1/files/{deleted_id}").status_code == 200
    before = stored_blobs(tmp_path / "content")
    etag = api.get(f"/v1/files/{spare_id}/content")["ETag"]

    settings.MASTER_KEYS = f"{new},{old}"
    dry = rotate("--dry-run")
    assert dry["files"]["rewrapped"] == 2 and dry["batches"]["rewrapped"] == 1
    assert set(File.objects.exclude(wrapped_key=None).values_list("key_id", flat=True)) == {
        "2025-old"
    }
    report = rotate()
    assert report["current_key_id"] == "2026-new"
    assert report["files"]["rewrapped"] == 2  # the spare and the batch's input, not the deleted
    assert report["batches"]["rewrapped"] == 1
    assert report["files"]["key_ids_in_use"] == {"2026-new": 2}
    assert report["batches"]["key_ids_in_use"] == {"2026-new": 1}
    assert File.objects.get(id=deleted_id).wrapped_key is None  # never resurrected
    assert stored_blobs(tmp_path / "content") == before  # content untouched

    again = rotate()
    assert again["files"]["rewrapped"] == 0 and again["batches"]["rewrapped"] == 0
    assert again["files"]["current"] == 2 and again["batches"]["current"] == 1

    settings.MASTER_KEYS = new  # the old key is gone from configuration
    response = api.get(f"/v1/files/{spare_id}/content")
    assert response.status_code == 200
    assert response["ETag"] == etag
    assert content_of(response) == spare
    run_worker(data["id"])  # the worker unwraps the batch key and the input's
    batch = finalize(data["id"])
    assert batch is not None and batch.status == "completed" and batch.completed == 2
    assert api.get(f"/v1/files/{batch.output_file_id}/content").status_code == 200


def test_rotation_refuses_when_a_key_is_unknown_and_changes_nothing_else(
    api: Api, catalog_model: Any, settings: Any
):
    old, new = master_key("old"), master_key("new")
    settings.MASTER_KEYS = old
    file_id = api.upload(jsonl(request_line())).json()["id"]
    wrapped = bytes(File.objects.get(id=file_id).wrapped_key)

    settings.MASTER_KEYS = new  # the old key was dropped before rotating
    with pytest.raises(CommandError, match="keep the old master keys"):
        call_command("rotate_master_key", stdout=io.StringIO())
    file = File.objects.get(id=file_id)
    assert (file.key_id, bytes(file.wrapped_key)) == ("old", wrapped)

    settings.MASTER_KEYS = f"{new},{old}"
    out = io.StringIO()
    call_command("rotate_master_key", stdout=out)
    assert "files: rewrapped=1 current=0 unknown_key=0 damaged=0" in out.getvalue()
    assert Batch.objects.count() == 0
