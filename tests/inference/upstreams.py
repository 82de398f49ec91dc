"""Real upstreams for the external-engine tests (inference/external/).

`serve(model_dir)` starts `transformers serve` (transformers[serving], in the dev extras) on a
free port with continuous batching on (its K/V cache bounded: 64 blocks), serving a tiny model
the tests built, and waits for `/v1/models`; it skips the test, saying why, where
`transformers serve` is not installed.
`FaultProxy` stands between the client and the server (or in front of nothing) and answers
each request as its plan says: forwarded, a status with `Retry-After`, a cut connection, a cut
in the middle of an answer, a stall, or 401 without the right key. It counts what reached it,
and how many requests it held at once; `hold` keeps a request unanswered until its client closes
the connection, which the proxy notes (`closed_by_client`), as vLLM notices a client gone.
A plan's `status(200, body=…)` is a canned answer; `without_usage` and `finish_reason` rewrite
the server's own answers.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

START_SECONDS = 180


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve_command() -> Path | None:
    command = Path(sys.executable).parent / "transformers"
    if not command.exists():
        return None
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return None
    return command


@dataclass
class Served:
    url: str  # the OpenAI base, with /v1
    model: str  # the id /v1/models lists
    process: subprocess.Popen[bytes]
    log: Path


@contextlib.contextmanager
def serve(model_dir: Path, log_dir: Path) -> Iterator[Served]:
    """`transformers serve MODEL_DIR --continuous-batching` on CPU, until the block ends."""
    command = _serve_command()
    if command is None:
        pytest.skip("`transformers serve` is not installed (pip install -e '.[dev]')")
    port = free_port()
    log = log_dir / f"transformers-serve-{port}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "BOARDWALK_"))}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(command),
                "serve",
                str(model_dir),
                "--continuous-batching",
                # A bounded K/V cache: sized by default, continuous batching on the CPU grew
                # to 14 GB over two dozen requests and was killed for memory.
                "--cb-num-blocks",
                "64",
                "--cb-max-batch-tokens",
                "256",
                "--device",
                "cpu",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    served = Served(f"http://127.0.0.1:{port}/v1", str(model_dir), process, log)
    try:
        _wait_until_up(served)
        yield served
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_up(served: Served) -> None:
    host, port = "127.0.0.1", int(urlsplit(served.url).port or 0)
    give_up = time.monotonic() + START_SECONDS
    while time.monotonic() < give_up:
        if served.process.poll() is not None:
            pytest.fail(f"transformers serve exited:\n{served.log.read_text()[-3000:]}")
        connection = http.client.HTTPConnection(host, port, timeout=2)
        try:
            connection.request("GET", "/v1/models")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            connection.close()
        time.sleep(0.2)
    pytest.fail(f"transformers serve did not list its models:\n{served.log.read_text()[-3000:]}")


# -- the fault-injecting proxy -------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One answer of the proxy. `kind`: forward, status, cut (no answer at all), cut_body
    (headers and half a body, then closed), stall (no answer until `seconds` pass or the
    proxy closes, then closed), hold (no answer until the client closes its connection, or
    `seconds` pass, or the proxy closes). `path`: requests whose path ends so take it."""

    kind: str
    status: int = 0
    retry_after: str | None = None
    body: bytes | None = None
    seconds: float | None = None
    path: str = "/chat/completions"


def status(code: int, retry_after: str | None = None, body: Any = None, **kw: Any) -> Fault:
    raw = json.dumps(body).encode() if body is not None else None
    return Fault("status", status=code, retry_after=retry_after, body=raw, **kw)


def cut(**kw: Any) -> Fault:
    return Fault("cut", **kw)


def cut_body(**kw: Any) -> Fault:
    return Fault("cut_body", **kw)


def stall(seconds: float | None = None, **kw: Any) -> Fault:
    return Fault("stall", seconds=seconds, **kw)


def hold(seconds: float | None = None, **kw: Any) -> Fault:
    return Fault("hold", seconds=seconds, **kw)


class FaultProxy:
    """An HTTP proxy on a free port in a thread; `url` is its OpenAI base (`…/v1`)."""

    def __init__(
        self,
        upstream: str | None = None,
        *,
        api_key: str | None = None,
        delay: float = 0.0,
        without_usage: bool = False,
        finish_reason: str | None = None,
    ) -> None:
        self.upstream = urlsplit(upstream) if upstream else None
        self.api_key = api_key
        self.delay = delay  # seconds every forwarded request is held first
        self.without_usage = without_usage  # forwarded answers lose their `usage`
        # Forwarded answers' choices say this `finish_reason` (the tiny model, cut by
        # `max_tokens`, made to read as a model that stopped by itself).
        self.finish_reason = finish_reason
        self.faults: deque[Fault] = deque()
        # Each request: method, path, json, authorization, and `answer`, the fault's kind.
        self.seen: list[dict[str, Any]] = []
        self.closed_by_client: list[dict[str, Any]] = []  # held requests their client left
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                proxy._handle(self, b"")

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                proxy._handle(self, self.rfile.read(length))

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def plan(self, *faults: Fault) -> FaultProxy:
        with self._lock:
            self.faults.extend(faults)
        return self

    def posts(self) -> list[dict[str, Any]]:
        return [s for s in self.seen if s["method"] == "POST"]

    def close(self) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one request --------------------------------------------------------------------

    def _next(self, path: str) -> Fault:
        with self._lock:
            for fault in self.faults:
                if path.endswith(fault.path):
                    self.faults.remove(fault)
                    return fault
        return Fault("forward")

    def _handle(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        seen = {
            "method": handler.command,
            "path": handler.path,
            "json": json.loads(body) if body else None,
            "authorization": handler.headers.get("authorization"),
        }
        with self._lock:
            self.seen.append(seen)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            self._answer(handler, body, seen)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _answer(self, handler: BaseHTTPRequestHandler, body: bytes, seen: dict[str, Any]) -> None:
        if self.api_key is not None and handler.headers.get("authorization") != (
            f"Bearer {self.api_key}"
        ):
            error = {"error": {"message": "Invalid API key", "type": "invalid_request_error"}}
            seen["answer"] = "unauthorized"
            self._reply(handler, 401, json.dumps(error).encode())
            return
        fault = self._next(handler.path)
        seen["answer"] = fault.kind
        if fault.kind == "status":
            headers = {"retry-after": fault.retry_after} if fault.retry_after else {}
            default = {"error": {"message": f"injected {fault.status}", "code": "injected"}}
            self._reply(handler, fault.status, fault.body or json.dumps(default).encode(), headers)
        elif fault.kind == "cut":
            self._cut(handler)
        elif fault.kind == "cut_body":
            handler.send_response(200)
            handler.send_header("content-type", "application/json")
            handler.send_header("content-length", "400")
            handler.end_headers()
            handler.wfile.write(b'{"choices": [{"index": 0, "mess')
            handler.wfile.flush()
            self._cut(handler)
        elif fault.kind == "stall":
            self._closing.wait(fault.seconds)
            self._cut(handler)
        elif fault.kind == "hold":
            if self._client_left(handler, fault.seconds):
                with self._lock:
                    self.closed_by_client.append(seen)
            self._cut(handler)
        else:
            self._forward(handler, body)

    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        if self.delay:
            self._closing.wait(self.delay)
        if self.upstream is None:
            self._reply(handler, 404, b'{"detail": "Not Found"}')
            return
        connection = http.client.HTTPConnection(
            self.upstream.hostname or "127.0.0.1", self.upstream.port, timeout=120
        )
        try:
            headers = {"content-type": "application/json"}
            connection.request(handler.command, handler.path, body=body or None, headers=headers)
            response = connection.getresponse()
            content = response.read()
            kept = {
                k: v
                for k, v in response.getheaders()
                if k.lower() in ("content-type", "retry-after")
            }
            if (self.without_usage or self.finish_reason) and response.status == 200:
                answer = json.loads(content)
                if self.without_usage:
                    answer.pop("usage", None)
                for choice in answer["choices"] if self.finish_reason else ():
                    choice["finish_reason"] = self.finish_reason
                content = json.dumps(answer).encode()
            self._reply(handler, response.status, content, kept)
        finally:
            connection.close()

    @staticmethod
    def _reply(
        handler: BaseHTTPRequestHandler,
        code: int,
        content: bytes,
        headers: dict[str, str] | None = None,
    ) -> None:
        handler.send_response(code)
        headers = {"content-type": "application/json", **(headers or {})}
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("content-length", str(len(content)))
        handler.end_headers()
        handler.wfile.write(content)
        handler.wfile.flush()

    def _client_left(self, handler: BaseHTTPRequestHandler, seconds: float | None) -> bool:
        """Wait, answering nothing, until the client closes its connection (True), or
        `seconds` pass or the proxy closes (False)."""
        give_up = None if seconds is None else time.monotonic() + seconds
        sock = handler.connection
        while not self._closing.is_set():
            if give_up is not None and time.monotonic() >= give_up:
                return False
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable:
                try:
                    if sock.recv(1, socket.MSG_PEEK) == b"":
                        return True
                except OSError:
                    return True
        return False

    @staticmethod
    def _cut(handler: BaseHTTPRequestHandler) -> None:
        handler.close_connection = True
        with contextlib.suppress(OSError):
            handler.connection.shutdown(socket.SHUT_RDWR)
