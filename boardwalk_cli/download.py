"""`download`: a file's bytes to disk, resumable (`Range` + `If-Range`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import requests

from boardwalk_cli.client import CHUNK, NETWORK_ERRORS, Client, CliError, refusal


def download(client: Client, file_id: str, dest: Path) -> dict[str, Any]:
    """Download to `dest`, resuming `dest.part` if an earlier run left one.

    Every block is written to `dest.part` as it arrives, so a connection cut mid-body keeps
    every byte received (exit 3) and the next run asks for the rest (`Range`).
    `dest.part.etag` remembers the ETag the partial bytes came from; `If-Range` makes the
    server send the whole file again (200) if it changed, and then the partial is replaced.
    """
    part = dest.with_name(dest.name + ".part")
    etag_path = dest.with_name(dest.name + ".part.etag")
    etag = etag_path.read_text().strip() if etag_path.exists() else ""
    have = part.stat().st_size if part.exists() and etag else 0
    # Ranges count the file's own bytes: no content coding in between.
    headers = {"Accept-Encoding": "identity"}
    if have:
        headers |= {"Range": f"bytes={have}-", "If-Range": etag}
    response = client.call("GET", f"/files/{file_id}/content", headers=headers, stream=True)
    with response:
        if response.status_code == 416:
            resumed_from = have  # the partial already holds every byte
        elif response.status_code >= 400:
            raise refusal(response)
        else:
            resumed_from = have if response.status_code == 206 else 0
            etag_path.write_text(response.headers.get("etag", ""))
            with part.open("ab" if resumed_from else "wb") as out:
                _receive(response, out, part)
            length = response.headers.get("content-length")
            if length is not None and part.stat().st_size != resumed_from + int(length):
                raise _cut(part, "the connection ended early")
    os.replace(part, dest)
    etag_path.unlink(missing_ok=True)
    return {
        "file_id": file_id,
        "path": str(dest),
        "bytes": dest.stat().st_size,
        "resumed_from": resumed_from,
    }


def _receive(response: requests.Response, out: Any, part: Path) -> None:
    """Append the body to `out` as it arrives: `read1` hands over what the socket has, so a
    cut loses nothing already received (a buffered read would drop its unfilled buffer)."""
    try:
        while block := response.raw.read1(CHUNK):
            out.write(block)
            out.flush()
    except NETWORK_ERRORS as exc:
        out.flush()
        raise _cut(part, str(exc)) from exc


def _cut(part: Path, why: str) -> CliError:
    return CliError(
        f"download interrupted ({why}); {part.stat().st_size} bytes kept in {part}: "
        "run the same command again to resume",
        exit_code=3,
    )
