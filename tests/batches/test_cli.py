"""The `boardwalk` CLI, run as a real process against a live server with a real worker."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from batches.models import Batch
from files.models import File
from tests.conftest import ROOT, Tenant, jsonl, parse_jsonl, request_line

pytestmark = pytest.mark.django_db(transaction=True)


def cli_env(server: Any, key: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOARDWALK_")}
    env["PYTHONPATH"] = str(ROOT)
    env["BOARDWALK_BASE_URL"] = f"{server.url}/v1"
    if key is not None:
        env["BOARDWALK_API_KEY"] = key
    return env | extra


def cli(
    server: Any, key: str | None, *args: str, cwd: Path, **env: str
) -> subprocess.CompletedProcess:
    """`server` is the live server or a proxy in front of it (anything with a `url`)."""
    return subprocess.run(
        [sys.executable, "-m", "boardwalk_cli", *args],
        cwd=cwd,
        env=cli_env(server, key, **env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """An HTTP head (through the blank line) and whatever arrived after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            raise ConnectionError("closed before the head ended")
        data += more
    end = data.index(b"\r\n\r\n") + 4
    return data[:end], data[end:]


class CuttingProxy:
    """A real TCP proxy in front of the live server, one request per connection. It
    forwards the request, then the answer's head and at most `cut_after` bytes of its body
    (all of it when None), then drops the connection; with `stall` it holds the connection
    open instead, sending nothing more, until `close()`."""

    def __init__(self, live_server: Any) -> None:
        parts = urlsplit(live_server.url)
        self.upstream = (parts.hostname or "localhost", parts.port or 80)
        self.cut_after: int | None = None
        self.stall = False
        self.heads: list[str] = []  # each request's head, as the server received it
        self.body_sent: list[int] = []  # body bytes forwarded, per answer
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._released = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._released.set()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._forward, args=(conn,), daemon=True).start()

    def _forward(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.upstream) as upstream:
            head, _ = _read_head(client)  # GET: no request body
            self.heads.append(head.decode("latin-1"))
            upstream.sendall(head)
            head, body = _read_head(upstream)
            client.sendall(head)
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            )
            limit = length if self.cut_after is None else min(self.cut_after, length)
            sent = 0
            while sent < limit:
                if not body:
                    body = upstream.recv(65536)
                    if not body:
                        break
                piece = body[: limit - sent]
                client.sendall(piece)
                sent += len(piece)
                body = body[len(piece) :]
            self.body_sent.append(sent)
            if self.stall:
                self._released.wait(120)


@pytest.fixture
def proxy(live_server: Any) -> Iterator[CuttingProxy]:
    proxy = CuttingProxy(live_server)
    yield proxy
    proxy.close()


def ok(result: subprocess.CompletedProcess) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_cli_is_a_console_script_that_never_imports_django():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["boardwalk"] == "boardwalk_cli.main:main"
    probe = (
        "import sys, boardwalk_cli.main; "
        "assert not any(m.startswith('django') for m in sys.modules)"
    )
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


def test_a_download_cut_mid_body_keeps_every_byte_received_and_a_rerun_resumes_it(
    live_server, proxy: CuttingProxy, tenant: Tenant, catalog_model, tmp_path: Path
):
    body = jsonl(*(request_line(f"t{i}", content="x" * 500) for i in range(60)))
    assert len(body) > 30_000
    file_id = tenant.api.upload(body).json()["id"]
    etag = tenant.api.get(f"/v1/files/{file_id}/content")["ETag"]
    dest = tmp_path / "copy.jsonl"
    part = tmp_path / "copy.jsonl.part"
    args = ("download", file_id, "-o", str(dest), "--json")
    proxy.cut_after = 12_000
    cut = cli(proxy, tenant.write_key, *args, cwd=tmp_path)
    assert proxy.body_sent == [12_000]
    assert cut.returncode == 3, cut.stderr
    assert "Traceback" not in cut.stderr
    assert f"12000 bytes kept in {part}" in cut.stderr
    assert part.read_bytes() == body[:12_000]  # every byte that arrived, none lost
    assert not dest.exists()  # never a short file under the final name
    proxy.cut_after = None
    resumed = ok(cli(proxy, tenant.write_key, *args, cwd=tmp_path))
    rerun = proxy.heads[-1].lower()
    assert "range: bytes=12000-\r\n" in rerun and f"if-range: {etag}\r\n".lower() in rerun
    assert proxy.body_sent[-1] == len(body) - 12_000  # only the rest travelled
    assert resumed["resumed_from"] == 12_000
    assert dest.read_bytes() == body
    assert not part.exists() and not (tmp_path / "copy.jsonl.part.etag").exists()


def test_a_stalled_or_unreachable_server_is_a_network_error_not_a_traceback(
    live_server, proxy: CuttingProxy, tenant: Tenant, catalog_model, tmp_path: Path
):
    body = jsonl(*(request_line(f"t{i}", content="y" * 300) for i in range(40)))
    file_id = tenant.api.upload(body).json()["id"]
    dest = tmp_path / "copy.jsonl"
    # Half the body, then nothing: the read times out mid-body, the half is kept.
    proxy.cut_after, proxy.stall = 5_000, True
    stalled = cli(
        proxy,
        tenant.write_key,
        "download",
        file_id,
        "-o",
        str(dest),
        cwd=tmp_path,
        BOARDWALK_TIMEOUT="1",
    )
    assert stalled.returncode == 3, stalled.stderr
    assert "Traceback" not in stalled.stderr and "timed out" in stalled.stderr
    assert (tmp_path / "copy.jsonl.part").read_bytes() == body[:5_000]
    assert not dest.exists()
    # Nothing listening at all.
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    nobody = type("Nowhere", (), {"url": f"http://127.0.0.1:{port}"})()
    refused = cli(nobody, tenant.write_key, "batches", cwd=tmp_path)
    assert refused.returncode == 3 and "cannot reach" in refused.stderr
    assert "Traceback" not in refused.stderr
    bad = cli(live_server, tenant.write_key, "batches", cwd=tmp_path, BOARDWALK_TIMEOUT="soon")
    assert bad.returncode == 2 and "BOARDWALK_TIMEOUT" in bad.stderr


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
    # Run from another directory: the CLI writes beside the input, never into the cwd.
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    path = work / "requests.jsonl"
    path.write_bytes(jsonl(*inputs))
    args = ("--wait", "--poll-interval", "0.2", "--json")
    done = cli(live_server, tenant.write_key, "submit", str(path), *args, cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout)
    errors = Path(first["files"]["errors"])
    results = Path(first["files"]["results"])

    def reconcile(*rows: Path | str) -> subprocess.CompletedProcess:
        files = [str(f) for f in rows]
        return cli(live_server, None, "reconcile", str(path), *files, "--json", cwd=elsewhere)

    report = ok(reconcile(results, errors))
    assert report == {"total": 4, "succeeded": 2, "failed": 2, "missing": [], "unknown": []}
    # Without the error file, the failed rows have no row: reconcile names them, exit 1.
    missing = reconcile(results)
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
        cwd=elsewhere,
    )
    second = json.loads(retried.stdout)
    assert second["batch"]["id"] != first["batch"]["id"]
    retry_stem = f"requests.retry-{first['batch']['id']}"
    retry_input = work / f"{retry_stem}.jsonl"
    assert [r["custom_id"] for r in parse_jsonl(retry_input.read_bytes())] == [
        "too-long-1",
        "too-long-2",
    ]
    assert retry_input.read_bytes() == jsonl(inputs[1], inputs[3])  # the lines, unchanged
    assert second["batch"]["request_counts"]["total"] == 2
    # They fail again; the batch still completed (exit 0), its counts say what failed.
    assert retried.returncode == 0
    assert second["batch"]["request_counts"]["failed"] == 2
    # Only the documented files, all beside the input: no copy of the first batch's results.
    assert sorted(os.listdir(elsewhere)) == []
    assert sorted(os.listdir(work)) == sorted(
        [
            "requests.jsonl",
            "requests.jsonl.boardwalk.json",
            "requests.results.jsonl",
            "requests.errors.jsonl",
            f"{retry_stem}.jsonl",
            f"{retry_stem}.jsonl.boardwalk.json",
            f"{retry_stem}.results.jsonl",
            f"{retry_stem}.errors.jsonl",
        ]
    )
    # The original and the retry reconciled together: every row accounted for.
    together = ok(reconcile(results, errors, second["files"]["results"], second["files"]["errors"]))
    assert together == {"total": 4, "succeeded": 2, "failed": 2, "missing": [], "unknown": []}
    # Retrying the same batch again submits nothing new.
    again = cli(
        live_server,
        tenant.write_key,
        "retry",
        first["batch"]["id"],
        "--input",
        str(path),
        "--json",
        cwd=elsewhere,
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
    # The first line error is quoted once: "First: Line 1: …", never "line 1: Line 1: …".
    assert "First: Line 1: " in refused.stderr and "line 1: Line 1" not in refused.stderr
    assert Batch.objects.count() == 0


def _result(custom_id: str) -> dict[str, Any]:
    """A results row as the server writes it."""
    response = {"status_code": 200, "request_id": f"req_{custom_id}", "body": {}}
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": response,
        "error": None,
    }


def _error(custom_id: str) -> dict[str, Any]:
    """An error row as the server writes it."""
    error = {"code": "context_length_exceeded", "message": "too long"}
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": None,
        "error": error,
    }


def test_reconcile_takes_several_files_and_a_later_row_supersedes_an_earlier_one(
    live_server, tmp_path: Path
):
    requests_path = tmp_path / "requests.jsonl"
    requests_path.write_bytes(jsonl(*(request_line(i) for i in ("a", "b", "c", "d"))))
    files = {
        "first.results.jsonl": [_result("a")],
        "first.errors.jsonl": [_error("b"), _error("c")],
        "retry.results.jsonl": [_result("b")],  # b succeeded on the retry
        "retry.errors.jsonl": [_error("c")],
        "late.errors.jsonl": [_error("a"), _error("zz")],  # a later run of a, now failed
    }
    for name, rows in files.items():
        (tmp_path / name).write_bytes(jsonl(*rows))

    def reconcile(*names: str) -> subprocess.CompletedProcess:
        paths = [str(tmp_path / n) for n in names]
        return cli(
            live_server, None, "reconcile", str(requests_path), *paths, "--json", cwd=tmp_path
        )

    report = reconcile(*list(files)[:4])
    assert report.returncode == 1  # d has no row anywhere
    assert json.loads(report.stdout) == {
        "total": 4,
        "succeeded": 2,
        "failed": 1,
        "missing": ["d"],
        "unknown": [],
    }
    # Order decides: the last file's row wins, and an id not in the requests is named.
    later = json.loads(reconcile(*files).stdout)
    assert (later["succeeded"], later["failed"], later["unknown"]) == (1, 2, ["zz"])
    # The requests file given as a results file is refused, not counted as rows.
    wrong = reconcile("first.results.jsonl", "requests.jsonl")
    assert wrong.returncode == 2 and "requests.jsonl:1: not a results or error row" in wrong.stderr
    assert wrong.stdout == ""
    gone = reconcile("first.results.jsonl", "nope.jsonl")
    assert gone.returncode == 2 and "nope.jsonl: no such file" in gone.stderr


def _bad_lines() -> list[bytes]:
    """Eight lines, seven wrong in their own ways (line 6 repeats line 5's custom_id)."""
    no_max = request_line("no-max")
    del no_max["body"]["max_completion_tokens"]
    return [
        b"{not json",
        json.dumps(no_max).encode(),
        json.dumps({**request_line("get"), "method": "GET"}).encode(),
        json.dumps({**request_line("url"), "url": "/v1/embeddings"}).encode(),
        json.dumps(request_line("dup")).encode(),
        json.dumps(request_line("dup")).encode(),
        json.dumps(request_line("temp", temperature="hot")).encode(),
        json.dumps({"custom_id": "only-an-id"}).encode(),
    ]


@pytest.mark.parametrize("command", ["estimate", "submit"])
def test_every_line_error_of_a_refused_upload_is_shown(
    live_server, tenant: Tenant, catalog_model, tmp_path: Path, command: str
):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join(_bad_lines()) + b"\n")
    as_json = cli(live_server, tenant.write_key, command, str(bad), "--json", cwd=tmp_path)
    assert as_json.returncode == 1
    error = json.loads(as_json.stdout)["error"]  # the API's error object, whole
    assert error["code"] == "invalid_input_file"
    details = error["details"]
    assert error["error_count"] == len(details) >= 7
    assert {d["line"] for d in details} == {1, 2, 3, 4, 6, 7, 8}
    text = cli(live_server, tenant.write_key, command, str(bad), cwd=tmp_path)
    assert text.returncode == 1 and text.stdout == ""
    lines = text.stderr.splitlines()
    header = next(
        i for i, line in enumerate(lines) if line.split() == ["LINE", "FIELD", "CODE", "MESSAGE"]
    )
    rows = lines[header + 1 : header + 1 + len(details)]
    for detail, row in zip(details, rows, strict=True):
        line, field, code, message = row.split(maxsplit=3)
        assert (int(line), field, code) == (detail["line"], detail["field"] or "-", detail["code"])
        assert message.strip() == detail["message"]
    assert "in all" not in text.stderr  # every error was listed
    assert File.objects.count() == 0 and Batch.objects.count() == 0
    assert not (tmp_path / "bad.jsonl.boardwalk.json").exists()  # no upload to remember


def test_past_the_first_100_line_errors_the_total_is_shown(
    live_server, tenant: Tenant, catalog_model, tmp_path: Path
):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"{not json\n" * 150)
    result = cli(live_server, tenant.write_key, "submit", str(bad), cwd=tmp_path)
    assert result.returncode == 1
    assert "150 line errors in all; the API lists the first 100" in result.stderr
    lines = result.stderr.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("LINE ")))
    rows = lines[header + 1 : header + 101]
    assert [int(r.split()[0]) for r in rows] == list(range(1, 101))
    assert lines[header + 101 :] == ["150 line errors in all; the API lists the first 100"]
    error = json.loads(
        cli(live_server, tenant.write_key, "submit", str(bad), "--json", cwd=tmp_path).stdout
    )["error"]
    assert (error["error_count"], len(error["details"])) == (150, 100)
    assert Batch.objects.count() == 0


def test_the_progress_line_names_the_batch_and_ctrl_c_exits_130(
    live_server, tenant: Tenant, catalog_model, tmp_path: Path
):
    # No worker: the batch waits, so the CLI is still watching when it is interrupted.
    path = tmp_path / "requests.jsonl"
    path.write_bytes(jsonl(request_line("a")))
    # As from a terminal: a shell that starts the test run in the background (`cmd &` in a
    # script) sets SIGINT to ignored, children inherit that, and Python then never raises
    # KeyboardInterrupt; the child is started with the interpreter's handler in place.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "boardwalk_cli",
                "submit",
                str(path),
                "--wait",
                "--poll-interval",
                "0.2",
            ],
            cwd=tmp_path,
            env=cli_env(live_server, tenant.write_key),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, inherited)
    try:
        progress = process.stderr.readline()
        batch_id = json.loads((tmp_path / "requests.jsonl.boardwalk.json").read_text())["batch_id"]
        assert progress.startswith(f"{batch_id} [")
        assert "0/1" in progress
        process.send_signal(signal.SIGINT)
        _, rest = process.communicate(timeout=60)
    finally:
        process.kill()
        process.communicate()  # closes its pipes, whatever happened above
    assert process.returncode == 130
    assert "interrupted; run the same command again to continue" in rest
    assert "Traceback" not in rest
    helped = cli(live_server, None, "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "130 interrupted (Ctrl-C)" in " ".join(helped.stdout.split())


def test_json_is_taken_before_or_after_the_command(
    live_server, tenant: Tenant, catalog_model, tmp_path: Path
):
    path = tmp_path / "requests.jsonl"
    path.write_bytes(jsonl(request_line("a"), request_line("b")))
    before = ok(cli(live_server, tenant.write_key, "--json", "estimate", str(path), cwd=tmp_path))
    after = ok(cli(live_server, tenant.write_key, "estimate", str(path), "--json", cwd=tmp_path))
    assert before == after and before["request_count"] == 2
    text = cli(live_server, tenant.write_key, "estimate", str(path), cwd=tmp_path)
    assert text.returncode == 0 and text.stdout.startswith("2 requests, ")
    listed = ok(cli(live_server, tenant.write_key, "--json", "batches", cwd=tmp_path))
    assert listed["object"] == "list"
    # A refusal with --json first still prints the API's error object.
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"{not json\n")
    refused = cli(live_server, tenant.write_key, "--json", "submit", str(bad), cwd=tmp_path)
    assert refused.returncode == 1
    assert json.loads(refused.stdout)["error"]["code"] == "invalid_input_file"


def _into_a_closed_pipe(server: Any, key: str | None, *args: str, cwd: Path) -> tuple[int, str]:
    """Run the CLI with stdout a pipe nobody reads any more (`| head` that has exited)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "boardwalk_cli", *args],
            cwd=cwd,
            env=cli_env(server, key),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        os.close(write_end)
    return result.returncode, result.stderr


def test_a_reader_that_stops_early_is_no_error_and_no_traceback(
    live_server, tenant: Tenant, catalog_model, tmp_path: Path
):
    path = tmp_path / "requests.jsonl"
    path.write_bytes(jsonl(request_line("a")))
    ok(cli(live_server, tenant.write_key, "submit", str(path), "--json", cwd=tmp_path))
    for args in (("batches",), ("batches", "--json")):
        status, stderr = _into_a_closed_pipe(live_server, tenant.write_key, *args, cwd=tmp_path)
        assert (status, stderr) == (0, ""), stderr
    # The status stays the work's: reconcile finding a row missing is still 1.
    status, stderr = _into_a_closed_pipe(
        live_server, None, "reconcile", str(path), str(path), cwd=tmp_path
    )
    assert status == 2 and "Traceback" not in stderr  # a requests file is no results file
    (tmp_path / "none.results.jsonl").write_bytes(b"")
    status, stderr = _into_a_closed_pipe(
        live_server,
        None,
        "reconcile",
        str(path),
        str(tmp_path / "none.results.jsonl"),
        cwd=tmp_path,
    )
    assert (status, stderr) == (1, "")


def _bar_lines(stderr: str, file_id: str) -> list[tuple[int, int]]:
    """(bytes, total) of each progress bar drawn, in order."""
    drawn = []
    for piece in stderr.replace("\r", "\n").splitlines():
        if piece.startswith(f"{file_id} ["):
            done, total = piece.rsplit(" ", 2)[1].split("/")
            drawn.append((int(done), int(total)))
    return drawn


def test_download_progress_on_a_terminal_or_when_asked_and_never_otherwise(
    live_server, tenant: Tenant, catalog_model, tmp_path: Path
):
    body = jsonl(*(request_line(f"t{i}", content="x" * 500) for i in range(60)))
    file_id = tenant.api.upload(body).json()["id"]
    size = len(body)

    def fetch(*extra: str, tty: bool = False) -> tuple[int, str, str]:
        dest = tmp_path / f"copy-{len(list(tmp_path.iterdir()))}.jsonl"
        args = [sys.executable, "-m", "boardwalk_cli", "download", file_id, "-o", str(dest)]
        primary, secondary = os.openpty() if tty else (None, None)
        try:
            result = subprocess.run(
                [*args, *extra],
                cwd=tmp_path,
                env=cli_env(live_server, tenant.write_key),
                stdout=subprocess.PIPE,
                stderr=secondary if tty else subprocess.PIPE,
                timeout=300,
                check=False,
            )
            if tty:
                os.close(secondary)
                stderr = b""
                while True:
                    try:
                        more = os.read(primary, 65536)
                    except OSError:  # the terminal's far side is closed: all read
                        break
                    if not more:
                        break
                    stderr += more
            else:
                stderr = result.stderr
        finally:
            if tty:
                os.close(primary)
        assert dest.read_bytes() == body
        return result.returncode, result.stdout.decode(), stderr.decode()

    # Piped stderr (a script, a log): nothing, unless --progress asks for it.
    status, stdout, stderr = fetch()
    assert (status, stderr) == (0, "") and f"({size} bytes)" in stdout
    status, stdout, stderr = fetch("--json", "--progress")
    assert status == 0 and json.loads(stdout)["bytes"] == size
    drawn = _bar_lines(stderr, file_id)
    assert drawn[0] == (0, size) and drawn[-1] == (size, size)
    assert [d for d, _ in drawn] == sorted(d for d, _ in drawn)
    assert len(drawn) <= 11 and stderr.count("\r") == 0  # a line per tenth at most
    # A terminal gets the bar redrawn in place, then a newline; --json keeps it quiet.
    status, _, stderr = fetch(tty=True)
    assert status == 0 and "\r" in stderr and stderr.endswith("\n")
    assert _bar_lines(stderr, file_id)[-1] == (size, size)
    status, stdout, stderr = fetch("--json", tty=True)
    assert status == 0 and stderr == "" and json.loads(stdout)["bytes"] == size
