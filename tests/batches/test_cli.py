"""The `boardwalk` CLI, run as a real process against a live server with a real worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from batches.models import Batch
from tests.conftest import ROOT, Tenant, jsonl, parse_jsonl, request_line

pytestmark = pytest.mark.django_db(transaction=True)


def cli(live_server: Any, key: str | None, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOARDWALK_")}
    env["PYTHONPATH"] = str(ROOT)
    env["BOARDWALK_BASE_URL"] = f"{live_server.url}/v1"
    if key is not None:
        env["BOARDWALK_API_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "boardwalk.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def ok(result: subprocess.CompletedProcess) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_cli_is_a_console_script_that_never_imports_django():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["boardwalk"] == "boardwalk.cli:main"
    probe = "import sys, boardwalk.cli; assert not any(m.startswith('django') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", probe], cwd=ROOT, check=True, timeout=60)


def test_submit_wait_downloads_both_files_and_a_rerun_makes_no_second_batch(
    live_server, tenant: Tenant, catalog_model, in_process_worker, tmp_path: Path
):
    inputs = [request_line("a"), request_line("b"), request_line("c")]
    path = tmp_path / "requests.jsonl"
    path.write_bytes(jsonl(*inputs))
    first = ok(cli(live_server, tenant.write_key, "submit", str(path), "--json", cwd=tmp_path))
    state_path = tmp_path / "requests.jsonl.boardwalk.json"
    state = json.loads(state_path.read_text())
    assert state["batch_id"] == first["batch"]["id"]
    # Killed after the create request went out, before its answer was saved: the same key
    # answers the same batch.
    del state["batch_id"]
    state_path.write_text(json.dumps(state))
    done = ok(
        cli(
            live_server,
            tenant.write_key,
            "submit",
            str(path),
            "--wait",
            "--poll-interval",
            "0.2",
            "--json",
            cwd=tmp_path,
        )
    )
    assert done["batch"]["id"] == first["batch"]["id"]
    assert done["batch"]["status"] == "completed"
    assert Batch.objects.count() == 1
    results = parse_jsonl(Path(done["files"]["results"]).read_bytes())
    assert [r["custom_id"] for r in results] == ["a", "b", "c"]
    assert "errors" not in done["files"]  # nothing failed: no error file
    # And once more, from the saved state: still the same batch.
    again = ok(cli(live_server, tenant.write_key, "submit", str(path), "--json", cwd=tmp_path))
    assert again["batch"]["id"] == first["batch"]["id"]
    assert Batch.objects.count() == 1
    table = cli(live_server, tenant.write_key, "batches", cwd=tmp_path)
    assert table.returncode == 0 and first["batch"]["id"] in table.stdout
    assert table.stdout.splitlines()[0].split()[:2] == ["ID", "STATUS"]


def test_interrupted_download_resumes_and_the_bytes_match(
    live_server, tenant: Tenant, catalog_model, tmp_path: Path
):
    body = jsonl(*(request_line(f"t{i}", content="x" * 500) for i in range(50)))
    file_id = tenant.api.upload(body).json()["id"]
    etag = tenant.api.get(f"/v1/files/{file_id}/content")["ETag"]
    dest = tmp_path / "copy.jsonl"
    # What a download killed half-way leaves: the first bytes and the ETag they came from.
    (tmp_path / "copy.jsonl.part").write_bytes(body[:10_000])
    (tmp_path / "copy.jsonl.part.etag").write_text(etag)
    info = ok(
        cli(
            live_server,
            tenant.write_key,
            "download",
            file_id,
            "-o",
            str(dest),
            "--json",
            cwd=tmp_path,
        )
    )
    assert info["resumed_from"] == 10_000
    assert dest.read_bytes() == body
    assert not (tmp_path / "copy.jsonl.part").exists()
    # A partial from a file that has since changed (another ETag) is replaced, not extended.
    (tmp_path / "copy.jsonl.part").write_bytes(b"stale bytes of another version")
    (tmp_path / "copy.jsonl.part.etag").write_text('"an-old-etag"')
    info = ok(
        cli(
            live_server,
            tenant.write_key,
            "download",
            file_id,
            "-o",
            str(dest),
            "--json",
            cwd=tmp_path,
        )
    )
    assert info["resumed_from"] == 0
    assert dest.read_bytes() == body


def test_retry_resubmits_exactly_the_rows_that_did_not_succeed(
    live_server, tenant: Tenant, catalog_model, in_process_worker, tmp_path: Path
):
    long_prompt = "word " * catalog_model.revision.context_length
    inputs = [
        request_line("ok-1"),
        request_line("too-long-1", content=long_prompt),
        request_line("ok-2"),
        request_line("too-long-2", content=long_prompt),
    ]
    path = tmp_path / "requests.jsonl"
    path.write_bytes(jsonl(*inputs))
    args = ("--wait", "--poll-interval", "0.2", "--json")
    done = cli(live_server, tenant.write_key, "submit", str(path), *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout)
    errors = Path(first["files"]["errors"])
    results = Path(first["files"]["results"])
    report = ok(
        cli(
            live_server,
            None,
            "reconcile",
            str(path),
            str(results),
            str(errors),
            "--json",
            cwd=tmp_path,
        )
    )
    assert report == {"total": 4, "succeeded": 2, "failed": 2, "missing": [], "unknown": []}
    # Without the error file, the failed rows have no row: reconcile names them, exit 1.
    missing = cli(live_server, None, "reconcile", str(path), str(results), "--json", cwd=tmp_path)
    assert missing.returncode == 1
    assert json.loads(missing.stdout)["missing"] == ["too-long-1", "too-long-2"]

    retried = cli(
        live_server,
        tenant.write_key,
        "retry",
        first["batch"]["id"],
        "--input",
        str(path),
        *args,
        cwd=tmp_path,
    )
    second = json.loads(retried.stdout)
    assert second["batch"]["id"] != first["batch"]["id"]
    retry_input = tmp_path / f"requests.retry-{first['batch']['id']}.jsonl"
    assert [r["custom_id"] for r in parse_jsonl(retry_input.read_bytes())] == [
        "too-long-1",
        "too-long-2",
    ]
    assert retry_input.read_bytes() == jsonl(inputs[1], inputs[3])  # the lines, unchanged
    assert second["batch"]["request_counts"]["total"] == 2
    # They fail again; the batch still completed (exit 0), its counts say what failed.
    assert retried.returncode == 0
    assert second["batch"]["request_counts"]["failed"] == 2
    # Retrying the same batch again submits nothing new.
    again = cli(
        live_server,
        tenant.write_key,
        "retry",
        first["batch"]["id"],
        "--input",
        str(path),
        "--json",
        cwd=tmp_path,
    )
    assert json.loads(again.stdout)["batch"]["id"] == second["batch"]["id"]
    assert Batch.objects.count() == 2


def test_estimate_and_clear_errors(live_server, tenant: Tenant, catalog_model, tmp_path: Path):
    path = tmp_path / "requests.jsonl"
    path.write_bytes(jsonl(request_line("a"), request_line("b")))
    estimate = ok(cli(live_server, tenant.write_key, "estimate", str(path), "--json", cwd=tmp_path))
    assert estimate["request_count"] == 2 and estimate["credit_sufficient"] is True
    no_key = cli(live_server, None, "batches", cwd=tmp_path)
    assert no_key.returncode == 2 and "BOARDWALK_API_KEY" in no_key.stderr
    bad_key = cli(live_server, "bw_wrong", "batches", cwd=tmp_path)
    assert bad_key.returncode == 1 and "401 invalid_api_key" in bad_key.stderr
    assert "hreq_" in bad_key.stderr  # the request id, to quote when reporting
    missing = cli(
        live_server, tenant.write_key, "submit", str(tmp_path / "nope.jsonl"), cwd=tmp_path
    )
    assert missing.returncode == 2 and "no such file" in missing.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"custom_id": "x"}\n')
    refused = cli(live_server, tenant.write_key, "submit", str(bad), cwd=tmp_path)
    assert refused.returncode == 1 and "invalid_input_file" in refused.stderr
    assert Batch.objects.count() == 0
