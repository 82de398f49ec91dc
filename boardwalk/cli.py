"""`boardwalk`: a command-line client of the HTTP API (never imports Django).

    boardwalk submit requests.jsonl --wait     upload, create, watch, download both files
    boardwalk download FILE_ID [-o PATH]       resumable (Range + If-Range)
    boardwalk reconcile REQUESTS RESULTS [ERRORS] [MORE ...]   later rows supersede earlier
    boardwalk retry BATCH_ID --input requests.jsonl [--wait]
    boardwalk estimate requests.jsonl
    boardwalk batches

Configuration: BOARDWALK_API_KEY (required), BOARDWALK_BASE_URL (default
http://127.0.0.1:8000/v1), BOARDWALK_TIMEOUT (seconds without a byte before a request is
given up, default 60). Exit codes: 0 done (a waited batch ended `completed`, which does not
mean every row succeeded: see its counts and error file), 1 the API refused (an input file's
line errors are listed on stderr; with --json the API's error object is printed on stdout),
a waited batch ended otherwise, or `reconcile` found rows missing, 2 usage or configuration
error, 3 network error (the server could not be reached or the connection was cut: a
download keeps every byte received in `<output>.part` and the same command resumes it),
130 interrupted (Ctrl-C): run the same command again to continue.

`submit` keeps its progress in `<file>.boardwalk.json` beside the input (the uploaded file
id, the Idempotency-Key derived from the file's SHA-256, the batch id), written after each
step, so a re-run after any interruption continues where it stopped and never makes a
second batch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import requests
import urllib3

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
TERMINAL = ("completed", "failed", "cancelled", "expired")
CHUNK = 1024 * 1024
# What a connection that fails, stalls or is cut raises: requests' own exceptions, and
# urllib3's from reading a streamed body.
NETWORK_ERRORS = (requests.RequestException, urllib3.exceptions.HTTPError)


class CliError(Exception):
    def __init__(
        self, message: str, *, exit_code: int = 1, error: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.error = error  # the API's error object, when the API refused

    @property
    def code(self) -> str | None:
        return str(self.error.get("code")) if self.error else None


class Client:
    def __init__(self, base_url: str, api_key: str, *, timeout: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.session.headers["User-Agent"] = "boardwalk-cli/1"
        self.timeout = timeout

    def call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        url = f"{self.base_url}{path}"
        for attempt in range(4):
            try:
                response = self.session.request(method, url, timeout=self.timeout, **kwargs)
            except requests.RequestException as exc:
                raise CliError(f"cannot reach {url}: {exc}", exit_code=3) from exc
            retry_after = response.headers.get("retry-after")
            should = response.headers.get("x-should-retry")
            if should == "true" and retry_after and attempt < 3 and int(retry_after) <= 5:
                response.close()
                time.sleep(int(retry_after))  # short waits only; longer ones are reported
                continue
            break
        if response.status_code >= 400 and not kwargs.get("stream"):
            raise _refusal(response)
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.call(method, path, **kwargs).json()


def _refusal(response: requests.Response) -> CliError:
    """The API's refusal as an error that keeps the API's error object."""
    try:
        error = response.json()["error"]
        text = f"{response.status_code} {error.get('code')}: {error.get('message')}"
    except (ValueError, KeyError, TypeError):
        error = None
        text = f"{response.status_code} {response.reason}"
    except NETWORK_ERRORS as exc:  # the error body itself was cut
        raise CliError(f"cannot read the answer of {response.url}: {exc}", exit_code=3) from exc
    if response.headers.get("retry-after"):
        text += f" (retry after {response.headers['retry-after']} s)"
    request_id = response.headers.get("x-request-id")
    text = f"{text} [request {request_id}]" if request_id else text
    return CliError(text, error=error if isinstance(error, dict) else None)


# --- state beside the input ---------------------------------------------------------------


def _state_path(path: Path) -> Path:
    return path.with_name(path.name + ".boardwalk.json")


def _load_state(path: Path, digest: str, *, fresh: bool) -> dict[str, Any]:
    state_path = _state_path(path)
    if state_path.exists() and not fresh:
        state = json.loads(state_path.read_text())
        if state.get("sha256") == digest:
            return state
    # Derived from the content, so that a re-run finds the same batch; --new adds a nonce.
    nonce = f"-{secrets.token_hex(4)}" if fresh else ""
    return {"sha256": digest, "idempotency_key": f"cli-{digest}{nonce}"}


def _save_state(path: Path, state: dict[str, Any]) -> None:
    state_path = _state_path(path)
    tmp = state_path.with_name(state_path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, state_path)  # never a half-written state file


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _ensure_uploaded(client: Client, path: Path, state: dict[str, Any]) -> str:
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
    _save_state(path, state)
    return str(uploaded["id"])


def _create_body(file_id: str) -> dict[str, Any]:
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
            json=_create_body(file_id),
            headers={"Idempotency-Key": state["idempotency_key"]},
        )
    )


def submit_file(client: Client, path: Path, *, fresh: bool = False) -> dict[str, Any]:
    if not path.is_file():
        raise CliError(f"{path}: no such file", exit_code=2)
    state = _load_state(path, _sha256(path), fresh=fresh)
    if state.get("batch_id"):
        return dict(client.json("GET", f"/batches/{state['batch_id']}"))
    file_id = _ensure_uploaded(client, path, state)
    try:
        try:
            batch = _create(client, file_id, state)
        except CliError as exc:
            if exc.code != "invalid_input_file_id" or "file_id" not in state:
                raise
            # The upload saved earlier expired unused: upload again.
            del state["file_id"]
            batch = _create(client, _ensure_uploaded(client, path, state), state)
    except CliError as exc:
        if exc.code == "idempotency_key_reused":
            raise CliError(
                f"{exc}\nThis file was submitted before from another state file; "
                "add --new to submit it as a new batch.",
                error=exc.error,
            ) from exc
        raise
    state["batch_id"] = batch["id"]
    _save_state(path, state)
    return dict(batch)


# --- download -----------------------------------------------------------------------------


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
            raise _refusal(response)
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


# --- reconcile / retry --------------------------------------------------------------------


def _jsonl(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
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
    for _, row in _jsonl(path):
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
        for number, row in _jsonl(path):
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
            succeeded = {str(r.get("custom_id")) for _, r in _jsonl(Path(out["path"]))}
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


# --- presentation -------------------------------------------------------------------------


def _progress(batch: dict[str, Any], *, tty: bool) -> None:
    counts = batch.get("request_counts") or {}
    total = counts.get("total") or 0
    done = (counts.get("completed") or 0) + (counts.get("failed") or 0)
    width = 30
    filled = int(width * done / total) if total else 0
    line = (
        f"{batch['id']} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
        f"({counts.get('completed', 0)} ok, {counts.get('failed', 0)} failed) {batch['status']}"
    )
    sys.stderr.write(("\r" + line) if tty else (line + "\n"))
    sys.stderr.flush()


def wait(client: Client, batch: dict[str, Any], *, interval: float, quiet: bool) -> dict[str, Any]:
    tty = sys.stderr.isatty()
    delay = interval
    while batch["status"] not in TERMINAL:
        if not quiet:
            _progress(batch, tty=tty)
        time.sleep(delay)
        delay = min(delay * 1.5, max(interval, 30.0))
        batch = client.json("GET", f"/batches/{batch['id']}")
    if not quiet:
        _progress(batch, tty=tty)
        if tty:
            sys.stderr.write("\n")
    return batch


def _fetch_results(client: Client, batch: dict[str, Any], stem: Path) -> dict[str, Any]:
    files = {}
    for kind, key in (("results", "output_file_id"), ("errors", "error_file_id")):
        if batch.get(key):
            dest = stem.with_name(f"{stem.name}.{kind}.jsonl")
            files[kind] = download(client, batch[key], dest)["path"]
    return files


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2) if args.json else text)


def _submit_and_maybe_wait(client: Client, args: argparse.Namespace, path: Path) -> int:
    batch = submit_file(client, path, fresh=getattr(args, "new", False))
    result: dict[str, Any] = {"batch": batch}
    if args.wait:
        batch = wait(client, batch, interval=args.poll_interval, quiet=args.json)
        stem = path.with_suffix("") if path.suffix == ".jsonl" else path
        result = {"batch": batch, "files": _fetch_results(client, batch, stem)}
    lines = [f"{batch['id']} {batch['status']}"]
    lines += [f"{kind}: {p}" for kind, p in result.get("files", {}).items()]
    _emit(args, result, "\n".join(lines))
    return 0 if not args.wait or batch["status"] == "completed" else 1


def run(args: argparse.Namespace) -> int:
    if args.command == "reconcile":
        report = reconcile(Path(args.requests), [Path(f) for f in args.rows])
        text = (
            f"{report['total']} requests: {report['succeeded']} succeeded, "
            f"{report['failed']} failed, {len(report['missing'])} with no row"
        )
        text += "".join(f"\nmissing: {i}" for i in report["missing"])
        _emit(args, report, text)
        return 1 if report["missing"] else 0
    api_key = os.environ.get("BOARDWALK_API_KEY", "")
    if not api_key:
        raise CliError("set BOARDWALK_API_KEY to an API key (bw_…)", exit_code=2)
    base_url = os.environ.get("BOARDWALK_BASE_URL") or DEFAULT_BASE_URL
    client = Client(base_url, api_key, timeout=_timeout())
    if args.command == "submit":
        return _submit_and_maybe_wait(client, args, Path(args.file))
    if args.command == "download":
        dest = Path(args.output or f"{args.file_id}.jsonl")
        info = download(client, args.file_id, dest)
        _emit(args, info, f"{info['path']} ({info['bytes']} bytes)")
        return 0
    if args.command == "retry":
        input_path = Path(args.input)
        if not input_path.is_file():
            raise CliError(f"{input_path}: no such file", exit_code=2)
        new_file = retry_file(client, args.batch_id, input_path)
        if new_file is None:
            _emit(args, {"batch": None}, "every row succeeded: nothing to retry")
            return 0
        return _submit_and_maybe_wait(client, args, new_file)
    if args.command == "estimate":
        path = Path(args.file)
        if not path.is_file():
            raise CliError(f"{path}: no such file", exit_code=2)
        state = _load_state(path, _sha256(path), fresh=False)
        file_id = _ensure_uploaded(client, path, state)  # submit reuses this upload
        estimate = client.json("POST", "/batches/estimate", json=_create_body(file_id))
        text = (
            f"{estimate['request_count']} requests, {estimate['prompt_tokens']} prompt tokens, "
            f"at most {estimate['max_output_tokens']} output tokens; at most "
            f"{estimate['max_charge_microusd']} µUSD "
            f"({'covered' if estimate['credit_sufficient'] else 'NOT covered'} by credit)"
        )
        _emit(args, estimate, text)
        return 0 if estimate["credit_sufficient"] else 1
    if args.command == "batches":
        page = client.json("GET", "/batches", params={"limit": args.limit})
        rows = [
            (
                b["id"],
                b["status"],
                f"{b['request_counts']['completed']}/{b['request_counts']['total']}",
                str(b["request_counts"]["failed"]),
                time.strftime("%Y-%m-%d %H:%M", time.gmtime(b["created_at"])),
            )
            for b in page["data"]
        ]
        _emit(args, page, _table(("ID", "STATUS", "DONE", "FAILED", "CREATED (UTC)"), rows))
        return 0
    raise CliError(f"unknown command {args.command!r}", exit_code=2)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    )


def _report(exc: CliError, *, as_json: bool) -> None:
    """The error on stderr, with every line error the API returned; with --json the API's
    error object on stdout as well."""
    print(f"boardwalk: error: {exc}", file=sys.stderr)
    error = exc.error or {}
    details = [d for d in error.get("details") or [] if isinstance(d, dict)]
    if details:
        rows = [
            [str(d.get(k) or "-") for k in ("line", "field", "code", "message")] for d in details
        ]
        print(_table(("LINE", "FIELD", "CODE", "MESSAGE"), rows), file=sys.stderr)
        total = error.get("error_count")
        if isinstance(total, int) and total > len(details):
            print(
                f"{total} line errors in all; the API lists the first {len(details)}",
                file=sys.stderr,
            )
    if as_json and exc.error is not None:
        print(json.dumps({"error": exc.error}, indent=2))


def _timeout() -> float:
    raw = os.environ.get("BOARDWALK_TIMEOUT") or "60"
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise CliError(f"BOARDWALK_TIMEOUT={raw!r}: give seconds, above 0", exit_code=2)
    return value


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON instead of text")
    intro, *rest = __doc__.split("\n\n")
    top = argparse.ArgumentParser(
        prog="boardwalk",
        description=intro,
        epilog="\n\n".join(rest),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = top.add_subparsers(dest="command", required=True)

    def waiting(p: argparse.ArgumentParser) -> None:
        p.add_argument("--wait", action="store_true", help="watch until terminal, download")
        p.add_argument("--poll-interval", type=float, default=2.0, help="seconds (grows)")
        p.add_argument("--new", action="store_true", help="a new batch even if submitted before")

    p = sub.add_parser("submit", parents=[common], help="upload and create a batch")
    p.add_argument("file")
    waiting(p)
    p = sub.add_parser("download", parents=[common], help="download a file (resumable)")
    p.add_argument("file_id")
    p.add_argument("-o", "--output")
    p = sub.add_parser("reconcile", parents=[common], help="custom_ids with no result row")
    p.add_argument("requests")
    p.add_argument(
        "rows",
        nargs="+",
        metavar="RESULTS_OR_ERRORS",
        help="results and error files, oldest first (a retry's after the original's): "
        "a later row for a custom_id supersedes an earlier one",
    )
    p = sub.add_parser("retry", parents=[common], help="resubmit the rows that did not succeed")
    p.add_argument("batch_id")
    p.add_argument("--input", required=True, help="the batch's original requests file")
    waiting(p)
    p = sub.add_parser("estimate", parents=[common], help="cost before submitting")
    p.add_argument("file")
    p = sub.add_parser("batches", parents=[common], help="list recent batches")
    p.add_argument("--limit", type=int, default=20)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except CliError as exc:
        _report(exc, as_json=getattr(args, "json", False))
        return exc.exit_code
    except NETWORK_ERRORS as exc:  # one that no step above turned into a CliError
        print(f"boardwalk: error: network: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("boardwalk: interrupted; run the same command again to continue", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
