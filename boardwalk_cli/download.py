"""`download`: a file's bytes to disk, resumable (`Range` + `If-Range`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import requests

from boardwalk_cli.client import CHUNK, NETWORK_ERRORS, Client, CliError, refusal


def download(client: Client, file_id: str, dest: Path, *, progress: bool = False) -> dict[str, Any]:
    """Download to `dest`, resuming `dest.part` if an earlier run left one; with `progress`,
    a progress bar on stderr (redrawn in place on a terminal, a line per tenth elsewhere).

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
            length = response.headers.get("content-length")
            total = resumed_from + int(length) if length is not None else None
            bar = Progress(file_id, resumed_from, total) if progress else None
            with part.open("ab" if resumed_from else "wb") as out:
                _receive(response, out, part, bar)
            if bar is not None:
                bar.end()
            if total is not None and part.stat().st_size != total:
                raise _cut(part, "the connection ended early")
    os.replace(part, dest)
    etag_path.unlink(missing_ok=True)
    return {
        "file_id": file_id,
        "path": str(dest),
        "bytes": dest.stat().st_size,
        "resumed_from": resumed_from,
    }


def _receive(response: requests.Response, out: Any, part: Path, bar: Progress | None) -> None:
    """Append the body to `out` as it arrives: `read1` hands over what the socket has, so a
    cut loses nothing already received (a buffered read would drop its unfilled buffer)."""
    try:
        while block := response.raw.read1(CHUNK):
            out.write(block)
            out.flush()
            if bar is not None:
                bar.advance(len(block))
    except NETWORK_ERRORS as exc:
        out.flush()
        if bar is not None:
            bar.end()
        raise _cut(part, str(exc)) from exc


class Progress:
    """The download's bar on stderr, in the shape of `submit --wait`'s: redrawn in place on
    a terminal, else one line per tenth of the file (a log, not a flood). Drawn only when
    the shown step changes: `read1` hands over blocks of a few KiB at a time."""

    WIDTH = 30

    def __init__(self, file_id: str, have: int, total: int | None) -> None:
        self.file_id = file_id
        self.have = have
        self.total = total
        self.tty = sys.stderr.isatty()
        self.step: int | None = None
        self.drawn = -1  # the byte count last drawn
        self._draw()

    def advance(self, n: int) -> None:
        self.have += n
        self._draw()

    def end(self) -> None:
        """The last figure (where a cut stopped), then the line ends."""
        if self.drawn != self.have:
            self._draw(always=True)
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()

    def _draw(self, *, always: bool = False) -> None:
        if self.total:
            done = min(self.have, self.total)
            step = done * (100 if self.tty else 10) // self.total
            filled = self.WIDTH * done // self.total
            shown = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{self.total} bytes"
        else:  # no length announced: the bytes so far, a step per MiB
            step = self.have >> 20
            shown = f"{self.have} bytes"
        if step == self.step and not always:
            return
        self.step, self.drawn = step, self.have
        line = f"{self.file_id} {shown}"
        sys.stderr.write(("\r" + line) if self.tty else (line + "\n"))
        sys.stderr.flush()


def _cut(part: Path, why: str) -> CliError:
    return CliError(
        f"download interrupted ({why}); {part.stat().st_size} bytes kept in {part}: "
        "run the same command again to resume",
        exit_code=3,
    )
