"""The server `manage.py serve` starts: slow or idle clients cannot hold
the threads that other requests need. A real server process on loopback, with short limits
and a pool of only 4 threads, so a stalled client per thread would block everyone."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THREADS = 4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(data_dir: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "DATABASE_URL",
            "REDIS_URL",
            "BOARDWALK_S3_BUCKET",
            "DJANGO_SECRET_KEY",
            "BOARDWALK_MASTER_KEYS",
            "BOARDWALK_API_KEY_PEPPER",
        )
    }
    env.update(
        BOARDWALK_DATA_DIR=str(data_dir),
        BOARDWALK_HTTP_THREADS=str(THREADS),
        BOARDWALK_HTTP_HEADER_TIMEOUT="2",
        BOARDWALK_HTTP_READ_TIMEOUT="2",
        BOARDWALK_HTTP_MIN_BODY_RATE="1000",
        OMP_NUM_THREADS="1",
    )
    return env


def _manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return result.stdout


def _request(port: int, raw: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(raw)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def _healthz(port: int) -> bytes:
    return _request(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    env = _env(tmp_path_factory.mktemp("serve"))
    _manage(env, "migrate", "--noinput", "-v", "0")
    _manage(env, "create_org", "slow-clients")
    key = json.loads(_manage(env, "create_api_key", "--org", "slow-clients", "--json"))["api_key"]
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if b" 200 " in _healthz(port):
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("manage.py serve did not come up")
            time.sleep(0.5)
        yield port, key
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_idle_partial_headers_hold_no_thread_and_time_out_with_408(server: tuple[int, str]):
    port, _ = server
    idle = []
    try:
        for _ in range(THREADS * 3):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-a: ")
            idle.append(sock)
        time.sleep(0.5)
        # More stalled heads than threads: the others are still served.
        assert b" 200 " in _healthz(port)
        idle[0].settimeout(15)
        answer = idle[0].recv(4096)
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b"request_timeout" in answer
    finally:
        for sock in idle:
            sock.close()


def test_a_trickling_upload_is_cut_with_408_and_others_are_served(server: tuple[int, str]):
    port, key = server
    slow = []
    try:
        for _ in range(THREADS - 1):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(
                b"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                + key.encode()
                + b"\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                b"Content-Length: 100000\r\n\r\n--b\r\n"
            )
            slow.append(sock)
        started = time.monotonic()
        answers: dict[int, bytes] = {}
        while len(answers) < len(slow) and time.monotonic() - started < 30:
            for index, sock in enumerate(slow):
                if index in answers:
                    continue
                try:
                    sock.sendall(b"x")  # one byte at a time, far below the minimum rate
                    sock.settimeout(0.01)
                    data = sock.recv(4096)
                    if data:
                        answers[index] = data
                except (TimeoutError, BlockingIOError):
                    pass
                except OSError:
                    answers[index] = b"closed"
            assert b" 200 " in _healthz(port)  # served all along
            time.sleep(0.3)
        assert len(answers) == len(slow), "slow uploads were never cut"
        assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers.values()), answers
        assert time.monotonic() - started < 30
    finally:
        for sock in slow:
            sock.close()


@pytest.fixture(scope="module")
def outage_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A production-mode server whose database and broker refuse connections: every
    authenticated request answers 503 backend_unavailable, before its body is read."""
    env = _env(tmp_path_factory.mktemp("outage"))
    dead = _free_port()
    env.update(
        DATABASE_URL=f"postgres://postgres@127.0.0.1:{dead}/none",
        REDIS_URL=f"redis://127.0.0.1:{dead}/0",
        DJANGO_SECRET_KEY="outage-" * 8,
        BOARDWALK_MASTER_KEYS="k1:" + "A" * 43 + "=",
        BOARDWALK_API_KEY_PEPPER="pepper-" * 6,
    )
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--workers", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if _healthz(port).startswith(b"HTTP/1.1 "):  # any answer: it is serving
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("manage.py serve did not come up")
            time.sleep(0.5)
        yield port
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _post(connection: http.client.HTTPConnection, path: str, size: int) -> tuple[int, str, dict]:
    connection.request(
        "POST",
        path,
        body=b"x" * size,
        headers={"Authorization": "Bearer bw_nokey", "Content-Type": "application/json"},
    )
    answer = connection.getresponse()
    body = json.loads(answer.read())
    return answer.status, answer.getheader("Connection") or "", body


@pytest.mark.parametrize("path", ["/v1/files", "/v1/batches"])
def test_a_503_before_the_body_was_read_leaves_a_kept_alive_connection_usable(
    outage_server: int, path: str
):
    """An answer given before the body was read announced keep-alive and the server then
    closed the connection, so the client's next request on it failed."""
    connection = http.client.HTTPConnection("127.0.0.1", outage_server, timeout=30)
    try:
        status, said, body = _post(connection, path, 1000)
        assert (status, body["error"]["code"]) == (503, "backend_unavailable")
        assert said == "keep-alive"
        kept = connection.sock
        for _ in range(2):  # the same connection serves the next requests
            status, said, body = _post(connection, path, 1000)
            assert (status, said, body["error"]["code"]) == (
                503,
                "keep-alive",
                "backend_unavailable",
            )
            assert connection.sock is kept and kept is not None
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("path", "size", "status"),
    [("/v1/files", 300_000, 503), ("/v1/batches", 300_000, 503), ("/v1/batches", 3_000_000, 413)],
)
def test_an_answer_that_leaves_a_large_body_unread_says_connection_close(
    outage_server: int, path: str, size: int, status: int
):
    connection = http.client.HTTPConnection("127.0.0.1", outage_server, timeout=30)
    try:
        answered, said, _ = _post(connection, path, size)
        assert (answered, said) == (status, "close")
        assert connection.sock is None  # http.client took the word and closed its side
        # The client's next request goes on a new connection, and is answered.
        assert _post(connection, path, 1000)[:2] == (503, "keep-alive")
    finally:
        connection.close()
