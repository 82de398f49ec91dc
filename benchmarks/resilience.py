"""Resource-bounds benchmark (issue 7): slow clients against the server, and validation memory.

1. Slow clients. A real server on loopback, embedded default, bootstrapped demo. While 50
   connections hold a partial request head (`GET /healthz HTTP/1.1\\r\\nHost: x\\r\\nX-a: `, then
   silence) and 10 authenticated uploads trickle 1 byte a second, `GET /healthz` and a small
   upload (a valid 2-line file) are timed one after another (client timeout 5 s). Side by side:
   - boardwalk: `manage.py serve` (project.server.BoundedThreadWorker, default limits);
   - baseline: the server `serve` ran before issue 7, gunicorn `gthread`, 1 process x 8
     threads, no read timeouts (same app).
   The attack is re-opened when the server cuts it, for the whole measuring window.
2. Validation memory. Peak RSS growth of validating one 20 MiB line whose `messages` holds
   8,388,608 invalid items, fed in 1 MiB reads, in a fresh process each: boardwalk's validator
   and, with --old-validator, main's validator before issue 7 (git show; needs ~3 GB).

Loopback only; every loop is bounded in count and time.

    .venv/bin/python benchmarks/resilience.py [--samples 40] [--old-validator]
"""

# ruff: noqa: S603, S607 (the benchmark starts our own server, manage.py and git by name)
from __future__ import annotations

import argparse
import io
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IDLE_HEADS = 50
SLOW_UPLOADS = 10
CLIENT_TIMEOUT = 5.0
ITEMS = 8 * 1024 * 1024
LINE_BYTES = 20 * 1024 * 1024


# -- slow clients ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(data_dir: Path) -> dict[str, str]:
    drop = ("DATABASE_URL", "REDIS_URL", "BOARDWALK_S3_BUCKET", "DJANGO_SECRET_KEY")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(BOARDWALK_DATA_DIR=str(data_dir), OMP_NUM_THREADS="1")
    return env


def _exchange(port: int, raw: bytes) -> tuple[float | None, bytes]:
    """Seconds to a complete answer, or None past CLIENT_TIMEOUT."""
    started = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT) as sock:
            sock.sendall(raw)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if time.perf_counter() - started > CLIENT_TIMEOUT:
                    return None, b""
    except OSError:
        return None, b""
    return time.perf_counter() - started, b"".join(chunks)


def _healthz_request() -> bytes:
    return b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def _upload_request(key: str, model: str) -> bytes:
    lines = b"".join(
        json.dumps(
            {
                "custom_id": f"t{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": model,
                    "messages": [{"role": "user", "content": "hello"}],
                    "max_completion_tokens": 8,
                },
            }
        ).encode()
        + b"\n"
        for i in range(2)
    )
    body = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="r.jsonl"\r\n\r\n'
        + lines
        + b"\r\n--b--\r\n"
    )
    return (
        b"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Authorization: Bearer " + key.encode() + b"\r\n"
        b"Content-Type: multipart/form-data; boundary=b\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


class Attack:
    """50 idle partial heads + 10 uploads at 1 byte/s, re-opened when cut, until stopped."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.stop = threading.Event()
        self.reopened = 0
        self.threads = [threading.Thread(target=self._idle, args=(i,)) for i in range(IDLE_HEADS)]
        self.threads += [threading.Thread(target=self._slow) for _ in range(SLOW_UPLOADS)]

    def __enter__(self) -> Attack:
        for thread in self.threads:
            thread.start()
        time.sleep(1.0)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=10)

    def _connect(self, head: bytes) -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            sock.sendall(head)
            return sock
        except OSError:
            return None

    def _hold(self, head: bytes, trickle: bool) -> None:
        while not self.stop.is_set():
            sock = self._connect(head)
            if sock is None:
                self.stop.wait(0.2)
                continue
            sock.settimeout(1.0)
            try:
                while not self.stop.is_set():
                    if trickle:
                        sock.sendall(b"x")
                    try:
                        sock.recv(4096)
                        break  # answered or closed: the server cut us
                    except TimeoutError:
                        continue
            except OSError:
                pass
            finally:
                sock.close()
            self.reopened += 1

    def _idle(self, index: int) -> None:
        self._hold(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-a: ", trickle=False)

    def _slow(self) -> None:
        head = (
            b"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
            + self.key.encode()
            + b"\r\nContent-Type: multipart/form-data; boundary=b\r\n"
            b"Content-Length: 1048576\r\n\r\n--b\r\n"
        )
        self._hold(head, trickle=True)


def _start(kind: str, env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    if kind == "boardwalk":
        command = [sys.executable, "manage.py", "serve", "--port", str(port)]
    else:  # the pre-issue-7 server: gthread, 1 x 8 threads, no read timeouts
        command = [
            sys.executable, "-m", "gunicorn", "project.wsgi:application",
            "--worker-class", "gthread", "--workers", "1", "--threads", "8",
            "--timeout", "300", "--bind", f"127.0.0.1:{port}", "--no-control-socket",
        ]  # fmt: skip
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        seconds, answer = _exchange(port, _healthz_request())
        if seconds is not None and b" 200 " in answer:
            return process
        if process.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {process.returncode}")
        time.sleep(0.5)
    _stop(process)
    raise RuntimeError(f"{kind} server did not come up")


def _stop(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _measure(port: int, request: bytes, samples: int) -> dict[str, float | int]:
    times, failures = [], 0
    for _ in range(samples):
        seconds, answer = _exchange(port, request)
        if seconds is None or b" 200 " not in answer.split(b"\r\n", 1)[0] + b" ":
            failures += 1
        else:
            times.append(seconds)
    times.sort()
    if not times:
        return {"ok": 0, "failed": failures}
    return {
        "ok": len(times),
        "failed": failures,
        "p50_ms": statistics.median(times) * 1000,
        "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] * 1000,
    }


def slow_clients(samples: int) -> Iterator[tuple[str, str, dict[str, float | int]]]:
    with tempfile.TemporaryDirectory(prefix="bw-resilience-") as tmp:
        env = _env(Path(tmp))
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT, env=env, check=True,
        )  # fmt: skip
        demo = json.loads(
            subprocess.run(
                [sys.executable, "manage.py", "bootstrap_demo", "--json"],
                cwd=ROOT, env=env, check=True, capture_output=True, text=True,
            ).stdout.strip().splitlines()[-1]
        )  # fmt: skip
        upload = _upload_request(demo["api_key"], demo["model"])
        for kind in ("boardwalk", "baseline"):
            port = _free_port()
            process = _start(kind, env, port)
            try:
                _measure(port, _healthz_request(), 5)  # warm-up
                _measure(port, upload, 3)
                yield kind, "healthz, quiet", _measure(port, _healthz_request(), samples)
                yield kind, "upload, quiet", _measure(port, upload, samples // 4)
                with Attack(port, demo["api_key"]):
                    yield kind, "healthz, attacked", _measure(port, _healthz_request(), samples)
                    yield kind, "upload, attacked", _measure(port, upload, samples // 4)
            finally:
                _stop(process)


# -- validation memory ----------------------------------------------------------------------


def _peak_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass


def _attack_line() -> bytes:
    head = (
        b'{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":'
        b'"boardwalk/tiny-chat","max_completion_tokens":8,"user":"'
    )
    items = b"1," * (ITEMS - 1) + b"1"
    tail = b'"messages":[' + items + b"]}}\n"
    padding = LINE_BYTES - len(head) - len(tail) - 2
    return head + b"u" * padding + b'",' + tail


def _validate_child(package: str) -> None:
    """In a fresh process: validate the attack line, print peak RSS growth and the report."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    module = __import__(package, fromlist=["InputValidator", "ModelTarget"])
    target = module.ModelTarget(name="boardwalk/tiny-chat", context_length=4096, media=frozenset())
    line = _attack_line()
    validator = module.InputValidator(lambda name: target)
    _reset_peak()
    before, started = _peak_mib(), time.perf_counter()
    stream = io.BytesIO(line)
    while chunk := stream.read(1024 * 1024):
        validator.feed(chunk)
    report = validator.finish()
    print(
        json.dumps(
            {
                "growth_mib": _peak_mib() - before,
                "seconds": time.perf_counter() - started,
                "kept": len(report.errors),
                "counted": report.error_count,
                "line_mib": len(line) / 1024 / 1024,
            }
        )
    )


def _old_validator_package(into: Path) -> str:
    package = into / "validation_before_issue7"
    package.mkdir()
    listing = subprocess.run(
        ["git", "ls-tree", "--name-only", "543a49c", "files/validation/"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    for path in listing:
        source = subprocess.run(
            ["git", "show", f"543a49c:{path}"], cwd=ROOT, check=True, capture_output=True
        ).stdout
        (package / Path(path).name).write_bytes(source)
    return package.name


def validation_memory(old: bool) -> list[tuple[str, dict[str, float]]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="bw-validate-") as tmp:
        variants = [("boardwalk", "files.validation", str(ROOT))]
        if old:
            variants.append(("main before issue 7", _old_validator_package(Path(tmp)), tmp))
        for name, package, path in variants:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([path, str(ROOT)]))
            out = subprocess.run(
                [sys.executable, __file__, "--validate-child", package],
                cwd=ROOT, env=env, check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            results.append((name, json.loads(out.strip().splitlines()[-1])))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--old-validator", action="store_true")
    parser.add_argument("--skip-server", action="store_true")
    parser.add_argument("--validate-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.validate_child:
        _validate_child(args.validate_child)
        return

    if not args.skip_server:
        print(
            f"Slow clients: {IDLE_HEADS} idle partial heads + {SLOW_UPLOADS} uploads at 1 B/s; "
            f"client timeout {CLIENT_TIMEOUT:.0f} s"
        )
        print(f"{'server':<10} {'request':<18} {'ok':>4} {'failed':>6} {'p50 ms':>9} {'p99 ms':>9}")
        for kind, label, stats in slow_clients(args.samples):
            p50 = f"{stats['p50_ms']:9.1f}" if "p50_ms" in stats else f"{'-':>9}"
            p99 = f"{stats['p99_ms']:9.1f}" if "p99_ms" in stats else f"{'-':>9}"
            print(
                f"{kind:<10} {label:<18} {stats['ok']:>4} {stats['failed']:>6} {p50} {p99}",
                flush=True,
            )

    print(f"\nValidating one {LINE_BYTES // 2**20} MiB line of {ITEMS:,} invalid messages items")
    print(
        f"{'validator':<22} {'peak RSS growth MiB':>20} {'seconds':>8} {'kept':>5} {'counted':>9}"
    )
    for name, stats in validation_memory(args.old_validator):
        print(
            f"{name:<22} {stats['growth_mib']:>20.1f} {stats['seconds']:>8.2f} "
            f"{stats['kept']:>5} {stats['counted']:>9}"
        )


if __name__ == "__main__":
    main()
