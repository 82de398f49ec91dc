"""The fault suite's machinery: real processes on PostgreSQL, and a summary line per scenario.

Each scenario runs the production shape for real: `manage.py serve` (the web process) and
`manage.py run_worker` processes on the test database, and a redis-server the test starts
itself on a free port (so it can kill and restart it without touching anyone else's). Faults
are injected from outside: signals to processes, `pg_terminate_backend` on their database
sessions, and the test-only pause points of `boardwalk.faultpoints`, which stop a process at
an exact spot (inside a transaction, between taking an Idempotency-Key and creating the batch).

Every scenario ends by checking the invariants against the API and the database (`check_run`)
and records a `RunStats`; the terminal summary prints one line per scenario.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.conf import settings as django_settings
from django.db import connection

from batches.models import Batch, BatchItem
from billing.models import LedgerEntry
from billing.pricing import TokenPrices, token_charge
from tests.conftest import ROOT, jsonl, request_line

TERMINAL = {"completed", "cancelled", "failed", "expired"}
HOST = socket.gethostname()

needs_redis_server = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="needs the redis-server binary"
)

# Settings the processes run with: short enough that a scenario takes seconds, the same
# mechanisms as production. Printed with the summary so the figures say what they measured.
PROCESS_SETTINGS = {
    "BOARDWALK_ITEM_LEASE_SECONDS": os.environ.get("FAULTS_ITEM_LEASE_SECONDS", "5"),
    "BOARDWALK_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS": "5000",
    "BOARDWALK_DB_LOCK_TIMEOUT_MS": "2000",
}


# -- the summary ---------------------------------------------------------------------------


@dataclass
class RunStats:
    items: int = 0
    duplicates: int = 0
    lost: int = 0
    double_charged: int = 0


@dataclass
class Scenario:
    name: str
    runs: int = 0
    items: int = 0
    duplicates: int = 0
    lost: int = 0
    double_charged: int = 0
    recovery: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, stats: RunStats) -> None:
        self.runs += 1
        self.items += stats.items
        self.duplicates += stats.duplicates
        self.lost += stats.lost
        self.double_charged += stats.double_charged

    def line(self) -> str:
        if self.recovery:
            p50 = statistics.median(self.recovery)
            recovery = f"recovery s p50={p50:.1f} max={max(self.recovery):.1f}"
        else:
            recovery = "recovery s n/a"
        extra = f" ({'; '.join(self.notes)})" if self.notes else ""
        return (
            f"{self.name:<28} runs={self.runs:<3} items={self.items:<5} "
            f"duplicates={self.duplicates} lost={self.lost} "
            f"double-charged={self.double_charged} {recovery}{extra}"
        )

    def assert_clean(self) -> None:
        assert (self.duplicates, self.lost, self.double_charged) == (0, 0, 0), self.line()
        stuck = Batch.objects.filter(status__in=("finalizing", "cancelling"))
        assert not stuck.exists(), f"stuck batches: {list(stuck.values_list('id', 'status'))}"


_SCENARIOS: dict[str, Scenario] = {}


@pytest.fixture
def scenario(request: pytest.FixtureRequest) -> Callable[[str], Scenario]:
    def named(name: str) -> Scenario:
        return _SCENARIOS.setdefault(name, Scenario(name))

    return named


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _SCENARIOS:
        return
    settings_line = " ".join(f"{k}={v}" for k, v in PROCESS_SETTINGS.items())
    terminalreporter.section("fault suite")
    terminalreporter.write_line(f"process settings: {settings_line}")
    for item in _SCENARIOS.values():
        terminalreporter.write_line(item.line())


# -- processes -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[3]) == pid and int(entry.name) != pid:  # fields[3]: session id
                found.append(int(entry.name))
    return found


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat[stat.rindex(")") + 2]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    port: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def pids(self) -> list[int]:
        """The process and everything it started (its own session)."""
        return [self.pid, *_children(self.pid)]

    def stopped_pid(self) -> int | None:
        """A process of this group that stopped itself at a fault point, if any."""
        return next((pid for pid in self.pids() if _state(pid) == "T"), None)

    def kill9(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait(timeout=30)

    def signal_all(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def stop(self) -> None:
        if self.popen.poll() is not None:
            return
        self.signal_all(signal.SIGCONT)
        self.signal_all(signal.SIGINT)  # gunicorn: quick shutdown; run_worker: same as TERM
        try:
            self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill9()

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:]


def wait_for(predicate: Callable[[], Any], *, timeout: float = 240.0, what: str = "it") -> Any:
    """Poll for asynchronous work (not for time to pass: no clock depends on it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


class Http:
    """A tiny client for the web process (stdlib only, so faults are under our control)."""

    def __init__(self, port: int, key: str) -> None:
        self.port = port
        self.key = key

    def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        timeout: float = 120.0,
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            all_headers = {"Authorization": f"Bearer {self.key}", **(headers or {})}
            conn.request(method, path, body=body, headers=all_headers)
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def json(self, method: str, path: str, data: Any = None, **headers: str) -> tuple[int, Any]:
        body = b"" if data is None else orjson.dumps(data)
        status, _, content = self.request(
            method, path, body, {"Content-Type": "application/json", **headers}
        )
        return status, orjson.loads(content) if content else None

    def upload_body(self, content: bytes) -> tuple[bytes, str]:
        boundary = uuid.uuid4().hex
        body = (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
                f"--{boundary}\r\nContent-Disposition: form-data; "
                'name="file"; filename="requests.jsonl"\r\n'
                "Content-Type: application/jsonl\r\n\r\n"
            ).encode()
            + content
            + f"\r\n--{boundary}--\r\n".encode()
        )
        return body, f"multipart/form-data; boundary={boundary}"

    def upload(self, content: bytes) -> str:
        body, content_type = self.upload_body(content)
        status, _, data = self.request("POST", "/v1/files", body, {"Content-Type": content_type})
        assert status == 200, data[:500]
        return str(orjson.loads(data)["id"])

    def create(self, file_id: str, key: str) -> tuple[int, Any]:
        body = {
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        return self.json("POST", "/v1/batches", body, **{"Idempotency-Key": key})

    def content(self, file_id: str) -> bytes:
        status, _, data = self.request("GET", f"/v1/files/{file_id}/content")
        assert status == 200, data[:500]
        return data


class Stack:
    """Web process, worker processes and a private Redis, all on the test database."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.redis_port = free_port()
        self.redis: subprocess.Popen | None = None
        self.procs: list[Proc] = []
        self.web: Proc | None = None
        self.web_port = 0

    def env(self, **extra: str) -> dict[str, str]:
        db = connection.settings_dict
        host, port = db["HOST"] or "127.0.0.1", db["PORT"] or 5432
        env = dict(os.environ)
        env.pop("BOARDWALK_TEST_FAULT_POINT", None)
        env.update(
            DATABASE_URL=f"postgres://{db['USER']}@{host}:{port}/{db['NAME']}",
            REDIS_URL=f"redis://127.0.0.1:{self.redis_port}/0",
            BOARDWALK_BROKER_NAMESPACE="faults",
            BOARDWALK_MASTER_KEYS=django_settings.MASTER_KEYS,
            BOARDWALK_API_KEY_PEPPER=django_settings.API_KEY_PEPPER,
            DJANGO_SECRET_KEY=django_settings.SECRET_KEY,
            BOARDWALK_DATA_DIR=str(self.tmp),
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",
            **PROCESS_SETTINGS,
        )
        env.update(extra)
        return env

    # Redis ------------------------------------------------------------------------------

    def start_redis(self) -> None:
        with (self.tmp / "redis.log").open("a") as log:
            self._start_redis(log)
        wait_for(self._redis_up, timeout=30, what="redis-server")

    def _start_redis(self, log: Any) -> None:
        self.redis = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.redis_port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.tmp),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def _redis_up(self) -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            try:
                sock.connect(("127.0.0.1", self.redis_port))
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
            except OSError:
                return False

    def kill_redis(self) -> None:
        if self.redis is not None and self.redis.poll() is None:
            self.redis.kill()
            self.redis.wait()

    # Processes --------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> Proc:
        log = self.tmp / f"{name}.log"
        with log.open("a") as out:
            popen = subprocess.Popen(
                [sys.executable, "manage.py", *args],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: kill -9 takes its children too
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def start_web(self, *, name: str = "web", threads: int = 4, **env: str) -> Proc:
        """Start `manage.py serve`; the one named "web" is the one `web`/`web_port` name."""
        port = free_port()
        args = ["serve", "--host", "127.0.0.1", "--port", str(port)]
        args += ["--workers", "1", "--threads", str(threads)]
        proc = self._spawn(name, args, self.env(**env))
        proc.port, proc.extra = port, dict(env, threads=str(threads))
        wait_for(lambda: self._web_up(proc), timeout=120, what=f"the web process {name}")
        if name == "web":
            self.web, self.web_port = proc, port
        return proc

    def web_with(self, *, threads: int = 4, **env: str) -> Proc:
        """The web process with exactly these settings: reused if running, else (re)started."""
        wanted = dict(env, threads=str(threads))
        if self.web is not None and self.web.alive() and self.web.extra == wanted:
            return self.web
        if self.web is not None:
            self.web.stop()
        return self.start_web(threads=threads, **env)

    def workers(self, *envs: dict[str, str]) -> list[Proc]:
        """Exactly one running worker per settings in `envs` (reused if running as such)."""
        running = [p for p in self.procs if p.name.startswith("worker") and p.alive()]
        chosen: list[Proc] = []
        for env in envs:
            match = next((p for p in running if p.extra == env and p not in chosen), None)
            chosen.append(match or self.spawn_worker(**env))
        for proc in running:
            if proc not in chosen:
                proc.stop()
        for proc in chosen:
            self._wait_ready(proc)
        return chosen

    def tidy(self, *, workers: bool = False) -> None:
        """Nothing stays stopped or half-configured, Redis is up. `workers`: stop them all
        (after a scenario: they poll the tables every second, and the test database is
        truncated between tests, which would deadlock with them)."""
        for proc in self.procs:
            faulty = "BOARDWALK_TEST_FAULT_POINT" in proc.extra
            worker = workers and proc.name.startswith("worker")
            if proc.alive() and (faulty or worker or proc.stopped_pid() is not None):
                proc.stop()
        self.procs = [p for p in self.procs if p.alive()]
        if self.web is not None and not self.web.alive():
            self.web = None
        if self.redis is None or self.redis.poll() is not None:
            self.start_redis()

    def _web_up(self, proc: Proc) -> bool:
        if proc.popen.poll() is not None:
            pytest.fail(f"web process exited:\n{proc.tail()}")
        conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=2)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def spawn_worker(self, **env: str) -> Proc:
        """Start a worker without waiting for it (it loads torch meanwhile). It sweeps every
        second unless `env` sets BOARDWALK_SWEEP_INTERVAL_SECONDS (production: 15 s)."""
        name = f"worker-{len(self.procs)}"
        args = ["run_worker", "--threads", "1"]
        if "BOARDWALK_SWEEP_INTERVAL_SECONDS" not in env:
            args += ["--sweep-interval", "1"]
        proc = self._spawn(name, args, self.env(**env))
        proc.extra = dict(env)
        return proc

    def _wait_ready(self, proc: Proc) -> None:
        def ready() -> bool:
            if not proc.alive():
                pytest.fail(f"{proc.name} exited:\n{proc.tail()}")
            return "worker ready" in proc.log.read_text()

        wait_for(ready, timeout=180, what=proc.name)

    def close(self) -> None:
        for proc in self.procs:
            proc.stop()
        self.kill_redis()


@pytest.fixture(scope="session")
def _stack(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One Redis, web process and workers for the whole suite: starting Django and torch
    processes is the slow part, so scenarios reuse what is still healthy."""
    if shutil.which("redis-server") is None:
        pytest.skip("the fault suite starts its own Redis: needs the redis-server binary")
    stack = Stack(tmp_path_factory.mktemp("faults"))
    stack.start_redis()
    try:
        yield stack
    finally:
        stack.close()


@pytest.fixture
def stack(_stack: Stack, transactional_db: None) -> Iterator[Stack]:
    if not django_settings.IS_POSTGRES or not django_settings.REDIS_URL:
        pytest.skip("the fault suite runs the production shape: set DATABASE_URL and REDIS_URL")
    _stack.tidy()
    try:
        yield _stack
    finally:
        _stack.tidy(workers=True)
        connection.close()


# -- database-side fault injection and observation ------------------------------------------


def backends_of(pids: list[int] | None = None) -> list[int]:
    """PostgreSQL backends of the test database, but never the test's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, client_port FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        rows = cursor.fetchall()
    if pids is None:
        return [pid for pid, _ in rows]
    ports = _local_ports_of(pids)
    return [pid for pid, client_port in rows if client_port in ports]


def _local_ports_of(pids: list[int]) -> set[int]:
    """TCP source ports the given processes hold (to find their database sessions)."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                if parts[9] in inodes:
                    ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def terminate_backends(pids: list[int]) -> int:
    with connection.cursor() as cursor:
        for pid in pids:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    return len(pids)


def items_done(batch_id: str) -> int:
    return BatchItem.objects.filter(batch_id=batch_id, state__in=BatchItem.DONE).count()


def leased_by(proc: Proc, batch_id: str | None = None) -> dict[int, int]:
    """Items a worker process holds right now: id -> lease token."""
    rows = BatchItem.objects.filter(
        state=BatchItem.State.RUNNING, lease_owner__startswith=f"{HOST}:{proc.pid}:"
    )
    if batch_id:
        rows = rows.filter(batch_id=batch_id)
    return dict(rows.values_list("id", "lease_token"))


def reclaimed(snapshot: dict[int, int], victim: Proc) -> bool:
    """Has any of the victim's items been leased again (or finished) by someone else?"""
    prefix = f"{HOST}:{victim.pid}:"
    for owner, state, token in BatchItem.objects.filter(id__in=list(snapshot)).values_list(
        "lease_owner", "state", "lease_token"
    ):
        if state == BatchItem.State.RUNNING and owner and not owner.startswith(prefix):
            return True
        if state in BatchItem.DONE and token > 0:
            return True
    return False


def time_to_reclaim(snapshot: dict[int, int], victim: Proc, since: float) -> float | None:
    if not snapshot:
        return None
    wait_for(lambda: reclaimed(snapshot, victim), what="a re-claim of the victim's items")
    return time.monotonic() - since


# -- a run's inputs and invariants -----------------------------------------------------------


def batch_rows(n: int, *, max_tokens: int = 2, tag: str = "") -> list[dict[str, Any]]:
    return [
        request_line(f"{tag}task-{i}", content=f"Q{i} {tag}", max_tokens=max_tokens)
        for i in range(n)
    ]


def submit(http_: Http, rows: list[dict[str, Any]], key: str) -> str:
    file_id = http_.upload(jsonl(*rows))
    status, data = http_.create(file_id, key)
    assert status == 200, data
    return str(data["id"])


def wait_terminal(http_: Http, batch_id: str, timeout: float = 300.0) -> dict[str, Any]:
    def poll() -> dict[str, Any] | None:
        status, data = http_.json("GET", f"/v1/batches/{batch_id}")
        assert status in (200, 503), data  # an outage may answer 503, never 500
        return data if status == 200 and data["status"] in TERMINAL else None

    return wait_for(poll, timeout=timeout, what=f"batch {batch_id} to end")  # type: ignore[no-any-return]


def check_run(
    http_: Http, batch_id: str, inputs: list[dict[str, Any]], *, outcome: str = "completed"
) -> RunStats:
    """Every item published exactly once, the hold settled once, the charge = published rows;
    the batch ended as `outcome` says (an expiry publishes what finished, too)."""
    payload = wait_terminal(http_, batch_id)
    output = [orjson.loads(x) for x in http_.content(payload["output_file_id"]).splitlines()]
    errors = []
    if payload.get("error_file_id"):
        errors = [orjson.loads(x) for x in http_.content(payload["error_file_id"]).splitlines()]
    ids = [row["custom_id"] for row in output + errors]
    wanted = {row["custom_id"] for row in inputs}
    stats = RunStats(items=len(inputs))
    stats.duplicates = len(ids) - len(set(ids))
    stats.lost = len(wanted - set(ids))
    batch = Batch.objects.get(id=batch_id)
    published = BatchItem.objects.filter(batch_id=batch_id, published=True)
    stats.duplicates += max(0, len(output) - published.count())
    stats.lost += max(0, published.count() - len(output))
    ledger = LedgerEntry.objects.filter(batch_id=batch_id)
    holds = ledger.filter(kind="hold").count()
    releases = ledger.filter(kind="release").count()
    charges = list(ledger.filter(kind="charge").values_list("amount_microusd", flat=True))
    prices = TokenPrices(
        batch.price_input or 0, batch.price_cached_input or 0, batch.price_output or 0
    )
    expected = sum(
        token_charge(
            prices,
            prompt=row["response"]["body"]["usage"]["prompt_tokens"],
            cached=row["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"],
            completion=row["response"]["body"]["usage"]["completion_tokens"],
        )
        for row in output
    )
    if holds != 1 or releases != 1 or len(charges) > 1 or sum(charges) != expected:
        stats.double_charged += 1
    if batch.charge_microusd != expected:
        stats.double_charged += 1
    assert payload["status"] == outcome, payload
    return stats
