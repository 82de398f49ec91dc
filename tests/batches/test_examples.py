"""The guide's example programs (docs/examples) run end to end against a live server."""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.core.management import call_command

from batches.models import Batch
from tests.batches.conftest import finalize, run_worker
from tests.conftest import ROOT, Tenant, jsonl, parse_jsonl, request_line

pytestmark = pytest.mark.django_db(transaction=True)
EXAMPLES = ROOT / "docs" / "examples"
GUIDE = ROOT / "docs" / "GUIDE.md"


def guide_steps(marker: str) -> list[str]:
    """The commands of the guide's shell block holding `marker`, in order, comments off."""
    blocks = re.findall(r"```sh\n(.*?)```", GUIDE.read_text(), flags=re.S)
    block = next((b for b in blocks if marker in b), None)
    assert block is not None, f"docs/GUIDE.md shows no `{marker}`"
    return [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]


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
    not all(shutil.which(tool) for tool in ("node", "npm", "npx")),
    reason="Node.js (node, npm and npx) is not installed",
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
    # The guide's steps, as a reader follows them: batch.ts alone in a fresh directory (where
    # `npx tsx batch.ts` says "Cannot find module 'openai'"), the packages it names installed
    # beside it, then the command it shows, on this test's files.
    steps = guide_steps("npx tsx batch.ts")
    install = next(i for i, step in enumerate(steps) if step.startswith("npm install"))
    run = next(i for i, step in enumerate(steps) if step.startswith("npx tsx batch.ts"))
    assert install < run, steps
    node_dir = tmp_path_factory.mktemp("batch-ts")
    shutil.copy(EXAMPLES / "batch.ts", node_dir / "batch.ts")
    subprocess.run(
        [*shlex.split(steps[install]), "--silent", "--no-audit", "--no-fund"],
        cwd=node_dir,
        check=True,
        timeout=300,
        capture_output=True,
    )
    out = run_example(
        [*shlex.split(steps[run])[:3], str(tmp_path / "requests.jsonl"), str(tmp_path)],
        live_server,
        tenant.write_key,
        node_dir,
    )
    assert "no row: []" in out
    check_outputs(tmp_path, requests_file)


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq")
def test_the_bootstrap_walk_through_waits_for_its_batch(live_server, settings, tmp_path: Path):
    """`bootstrap_demo --example` prints a walk-through that polls until the batch is done.

    No worker runs until the walk-through has asked for its batch twice and heard
    `in_progress` both times: one that sleeps a fixed time and then reads `output_file_id`
    (a race on a loaded machine) has read null by then, and prints no results.
    """
    settings.MODELS_DIR = tmp_path / "models"
    printed = io.StringIO()
    call_command(
        "bootstrap_demo", "--example", "--base-url", f"{live_server.url}/v1", stdout=printed
    )
    walk_through = printed.getvalue().split("Try it", 1)[1].split("\n", 1)[1]
    # curl, noting each call once it has returned (what the walk-through has heard so far).
    calls = tmp_path / "curl-calls"
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "curl").write_text(
        f'#!/bin/sh\n{shutil.which("curl")} "$@"; rc=$?\necho "$*" >>{calls}\nexit $rc\n'
    )
    (shim / "curl").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOARDWALK_")}
    env["PATH"] = f"{shim}:{env['PATH']}"
    walk = subprocess.Popen(
        ["bash", "-c", walk_through],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        batch = None
        for _ in range(600):  # at most a minute: a guard, not a measurement
            batch = batch or Batch.objects.first()
            heard = calls.read_text().splitlines() if calls.exists() else []
            if batch and sum(f"/batches/{batch.id} " in line for line in heard) >= 2:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the walk-through never asked for its batch twice: {heard}")
        assert Batch.objects.get(id=batch.id).status == "in_progress"
        run_worker(batch.id)
        assert finalize(batch.id).status == "completed"
        out, err = walk.communicate(timeout=120)
    finally:
        walk.kill()
    assert walk.returncode == 0, out + err
    assert "status: in_progress" in out and "status: completed" in out, out
    rows = [orjson.loads(line) for line in out.splitlines() if line.startswith('{"id"')]
    assert [r["custom_id"] for r in rows] == ["task-1", "task-2"], out + err
    assert all(r["response"]["status_code"] == 200 for r in rows)
