"""`reconcile` and `retry`: each request's outcome across results and error files, and a new
input file of the rows that did not succeed."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from boardwalk_cli.client import Client, CliError
from boardwalk_cli.download import download
from boardwalk_cli.watch import TERMINAL


def jsonl_rows(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    """(line number, row) for each non-blank line."""
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield number, json.loads(line)
                except ValueError as exc:
                    raise CliError(f"{path}:{number}: not JSON ({exc})", exit_code=2) from exc


def _request_ids(path: Path) -> list[str]:
    ids = []
    for _, row in jsonl_rows(path):
        if row.get("type") in ("header", "section"):
            continue
        ids.append(str(row.get("custom_id")))
    return ids


def _succeeded(path: Path, number: int, row: dict[str, Any]) -> bool:
    """A results row (`error` null, a 2xx `response`) succeeded; an error row did not."""
    if "error" not in row and "response" not in row:
        raise CliError(f"{path}:{number}: not a results or error row", exit_code=2)
    status = (row.get("response") or {}).get("status_code")
    return row.get("error") is None and isinstance(status, int) and 200 <= status < 300


def reconcile(requests_path: Path, row_files: list[Path]) -> dict[str, Any]:
    """Each request's outcome across results and error files given oldest first: a later
    file's row for a custom_id supersedes an earlier one (a retry's result replaces the
    original error)."""
    for path in [requests_path, *row_files]:
        if not path.is_file():
            raise CliError(f"{path}: no such file", exit_code=2)
    wanted = _request_ids(requests_path)
    outcome: dict[str, bool] = {}
    for path in row_files:
        for number, row in jsonl_rows(path):
            outcome[str(row.get("custom_id"))] = _succeeded(path, number, row)
    known = set(wanted)
    return {
        "total": len(wanted),
        "succeeded": sum(1 for i in known if outcome.get(i) is True),
        "failed": sum(1 for i in known if outcome.get(i) is False),
        "missing": [i for i in wanted if i not in outcome],
        "unknown": sorted(set(outcome) - known),
    }


def retry_file(client: Client, batch_id: str, input_path: Path) -> Path | None:
    """Write a new input file of the rows that did not succeed; None if every row did."""
    batch = client.json("GET", f"/batches/{batch_id}")
    if batch["status"] not in TERMINAL:
        raise CliError(f"{batch_id} is {batch['status']}: wait until it is terminal")
    succeeded: set[str] = set()
    if batch.get("output_file_id"):
        # Read and thrown away: the only files retry leaves are the new input and its own.
        with tempfile.TemporaryDirectory(prefix="boardwalk-") as tmp:
            out = download(client, batch["output_file_id"], Path(tmp) / "results.jsonl")
            succeeded = {str(r.get("custom_id")) for _, r in jsonl_rows(Path(out["path"]))}
    kept = []
    with input_path.open("rb") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("type") in ("header", "section") or str(row.get("custom_id")) not in (
                succeeded
            ):
                kept.append(line if line.endswith(b"\n") else line + b"\n")
    if not any(json.loads(line).get("type") not in ("header", "section") for line in kept):
        return None
    target = input_path.with_name(f"{input_path.stem}.retry-{batch_id}.jsonl")
    target.write_bytes(b"".join(kept))
    return target
