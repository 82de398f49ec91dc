"""The guide's example programs (docs/examples) run end to end against a live server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Tenant, jsonl, parse_jsonl, request_line

pytestmark = pytest.mark.django_db(transaction=True)
EXAMPLES = ROOT / "docs" / "examples"
# The npm packages the TypeScript example needs (installed into a temporary directory).
NPM_PACKAGES = ("openai@6.49.0", "tsx@4.23.15")


def run_example(command: list[str], live_server: Any, key: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOARDWALK_")}
    env.update(BOARDWALK_BASE_URL=f"{live_server.url}/v1", BOARDWALK_API_KEY=key)
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def check_outputs(tmp_path: Path, ids: list[str]) -> None:
    results = parse_jsonl((tmp_path / "requests.results.jsonl").read_bytes())
    assert [r["custom_id"] for r in results] == ids
    assert all(r["response"]["status_code"] == 200 for r in results)
    assert not (tmp_path / "requests.errors.jsonl").exists()  # nothing failed: no error file


@pytest.fixture
def requests_file(tmp_path: Path) -> list[str]:
    ids = ["q-1", "q-2", "q-3"]
    (tmp_path / "requests.jsonl").write_bytes(jsonl(*(request_line(i) for i in ids)))
    return ids


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq")
def test_shell_example(
    live_server, tenant: Tenant, catalog_model, in_process_worker, tmp_path: Path, requests_file
):
    out = run_example(
        ["bash", str(EXAMPLES / "batch.sh"), "requests.jsonl", "."],
        live_server,
        tenant.write_key,
        tmp_path,
    )
    assert "no row: none" in out
    check_outputs(tmp_path, requests_file)


def test_python_example(
    live_server, tenant: Tenant, catalog_model, in_process_worker, tmp_path: Path, requests_file
):
    out = run_example(
        [sys.executable, str(EXAMPLES / "batch.py"), "requests.jsonl", "."],
        live_server,
        tenant.write_key,
        tmp_path,
    )
    assert "no row: []" in out
    check_outputs(tmp_path, requests_file)


@pytest.mark.skipif(
    not shutil.which("node") or not shutil.which("npm"),
    reason="Node.js (node and npm) is not installed",
)
def test_typescript_example(
    live_server,
    tenant: Tenant,
    catalog_model,
    in_process_worker,
    tmp_path: Path,
    tmp_path_factory,
    requests_file,
):
    node_dir = tmp_path_factory.mktemp("node")
    subprocess.run(
        ["npm", "install", "--silent", "--no-audit", "--no-fund", *NPM_PACKAGES],
        cwd=node_dir,
        check=True,
        timeout=300,
        capture_output=True,
    )
    shutil.copy(EXAMPLES / "batch.ts", node_dir / "batch.ts")
    out = run_example(
        [
            str(node_dir / "node_modules" / ".bin" / "tsx"),
            str(node_dir / "batch.ts"),
            str(tmp_path / "requests.jsonl"),
            str(tmp_path),
        ],
        live_server,
        tenant.write_key,
        tmp_path,
    )
    assert "no row: []" in out
    check_outputs(tmp_path, requests_file)
