"""`submit`: upload, then create the batch, with the progress kept beside the input
(`<file>.boardwalk.json`) so a re-run continues where it stopped and never makes a second
batch."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

from boardwalk_cli.client import CHUNK, Client, CliError


def _state_path(path: Path) -> Path:
    return path.with_name(path.name + ".boardwalk.json")


def load_state(path: Path, digest: str, *, fresh: bool) -> dict[str, Any]:
    state_path = _state_path(path)
    if state_path.exists() and not fresh:
        state = json.loads(state_path.read_text())
        if state.get("sha256") == digest:
            return state
    # Derived from the content, so that a re-run finds the same batch; --new adds a nonce.
    nonce = f"-{secrets.token_hex(4)}" if fresh else ""
    return {"sha256": digest, "idempotency_key": f"cli-{digest}{nonce}"}


def save_state(path: Path, state: dict[str, Any]) -> None:
    state_path = _state_path(path)
    tmp = state_path.with_name(state_path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, state_path)  # never a half-written state file


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_uploaded(client: Client, path: Path, state: dict[str, Any]) -> str:
    file_id = state.get("file_id")
    if file_id:
        # Reused as is even if the server has removed it since (its batch may have ended):
        # the create body must stay the same for the Idempotency-Key to find the batch.
        return str(file_id)
    with path.open("rb") as f:
        uploaded = client.json(
            "POST",
            "/files",
            data={"purpose": "batch"},
            files={"file": (path.name, f, "application/jsonl")},
        )
    state["file_id"] = uploaded["id"]
    save_state(path, state)
    return str(uploaded["id"])


def create_body(file_id: str) -> dict[str, Any]:
    return {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }


def _create(client: Client, file_id: str, state: dict[str, Any]) -> dict[str, Any]:
    return dict(
        client.json(
            "POST",
            "/batches",
            json=create_body(file_id),
            headers={"Idempotency-Key": state["idempotency_key"]},
        )
    )


def submit_file(client: Client, path: Path, *, fresh: bool = False) -> dict[str, Any]:
    if not path.is_file():
        raise CliError(f"{path}: no such file", exit_code=2)
    state = load_state(path, sha256(path), fresh=fresh)
    if state.get("batch_id"):
        return dict(client.json("GET", f"/batches/{state['batch_id']}"))
    file_id = ensure_uploaded(client, path, state)
    try:
        try:
            batch = _create(client, file_id, state)
        except CliError as exc:
            if exc.code != "invalid_input_file_id" or "file_id" not in state:
                raise
            # The upload saved earlier expired unused: upload again.
            del state["file_id"]
            batch = _create(client, ensure_uploaded(client, path, state), state)
    except CliError as exc:
        if exc.code == "idempotency_key_reused":
            raise CliError(
                f"{exc}\nThis file was submitted before from another state file; "
                "add --new to submit it as a new batch.",
                error=exc.error,
            ) from exc
        raise
    state["batch_id"] = batch["id"]
    save_state(path, state)
    return dict(batch)
