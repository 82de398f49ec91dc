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
130 interrupted (Ctrl-C): run the same command again to continue. A reader that stops early
(`boardwalk batches | head`) is no error: the status stays the work's (0 for a listing);
stderr closed while work goes on (its progress bar into `2>&1 | head`) stops it with 141.

`--json` may come before or after the command. `download` draws a progress bar on stderr
when stderr is a terminal (and not with --json), or whenever `--progress` is given.

`submit` keeps its progress in `<file>.boardwalk.json` beside the input (the uploaded file
id, the Idempotency-Key derived from the file's SHA-256, the batch id), written after each
step, so a re-run after any interruption continues where it stopped and never makes a
second batch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from boardwalk_cli.client import DEFAULT_BASE_URL, NETWORK_ERRORS, Client, CliError
from boardwalk_cli.download import download
from boardwalk_cli.reconcile import reconcile, retry_file
from boardwalk_cli.submit import create_body, ensure_uploaded, load_state, sha256, submit_file
from boardwalk_cli.watch import wait


def _fetch_results(
    client: Client, batch: dict[str, Any], stem: Path, *, progress: bool
) -> dict[str, Any]:
    files = {}
    for kind, key in (("results", "output_file_id"), ("errors", "error_file_id")):
        if batch.get(key):
            dest = stem.with_name(f"{stem.name}.{kind}.jsonl")
            files[kind] = download(client, batch[key], dest, progress=progress)["path"]
    return files


def _shows_progress(args: argparse.Namespace) -> bool:
    """A progress bar on stderr: asked for, or drawn where someone watches (a terminal), as
    `submit --wait` draws its own; never mixed into --json output unless asked for."""
    return getattr(args, "progress", False) or (sys.stderr.isatty() and not args.json)


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    _out(json.dumps(data, indent=2) if args.json else text)


def _out(text: str) -> None:
    """`text` on stdout. A reader that went away (`boardwalk batches | head`) has what it
    wanted: no error and no traceback, and the status stays the work's (0 for a listing, as
    `head` expects; not 141, which `set -o pipefail` would count as a failure)."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        _to_devnull(sys.stdout)


def _submit_and_maybe_wait(client: Client, args: argparse.Namespace, path: Path) -> int:
    batch = submit_file(client, path, fresh=getattr(args, "new", False))
    result: dict[str, Any] = {"batch": batch}
    if args.wait:
        batch = wait(client, batch, interval=args.poll_interval, quiet=args.json)
        stem = path.with_suffix("") if path.suffix == ".jsonl" else path
        files = _fetch_results(client, batch, stem, progress=_shows_progress(args))
        result = {"batch": batch, "files": files}
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
        info = download(client, args.file_id, dest, progress=_shows_progress(args))
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
        state = load_state(path, sha256(path), fresh=False)
        file_id = ensure_uploaded(client, path, state)  # submit reuses this upload
        estimate = client.json("POST", "/batches/estimate", json=create_body(file_id))
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
        _out(json.dumps({"error": exc.error}, indent=2))


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
    json_help = "print JSON instead of text"
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a command's own default would overwrite a `--json` given before the command.
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)
    intro, *rest = __doc__.split("\n\n")
    top = argparse.ArgumentParser(
        prog="boardwalk",
        description=intro,
        epilog="\n\n".join(rest),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--json", action="store_true", help=json_help)
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
    p.add_argument(
        "--progress", action="store_true", help="progress bar on stderr even when not a terminal"
    )
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
    except BrokenPipeError:
        # stderr closed while the work went on (`2>&1 | head` during a progress bar): the
        # work stopped there, as a process that SIGPIPE ends would (128 + 13), quietly.
        _to_devnull(sys.stdout, sys.stderr)
        return 141
    except CliError as exc:
        _report(exc, as_json=getattr(args, "json", False))
        return exc.exit_code
    except NETWORK_ERRORS as exc:  # one that no step above turned into a CliError
        print(f"boardwalk: error: network: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("boardwalk: interrupted; run the same command again to continue", file=sys.stderr)
        return 130


def _to_devnull(*streams: Any) -> None:
    """Point closed output streams at /dev/null: Python flushes them once more at exit, and
    that flush would otherwise print a BrokenPipeError of its own."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in streams:
        with contextlib.suppress(OSError, ValueError):  # a stream with no descriptor
            os.dup2(devnull, stream.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
