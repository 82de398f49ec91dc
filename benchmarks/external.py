"""External engines (issue 41): Boardwalk's dispatch through one worker against a direct client.

    .venv/bin/python benchmarks/external.py [--rows 1000] [--rounds 5] [--max-tokens 8]
        [--model-size tiny|bench] [--in-flight 32] [--ceiling-rows 5000]
        [--ceiling-in-flight 32] [--skip-serve] [--skip-ceiling] [--postgres] [--no-pin]
    # the same as a module: .venv/bin/python -m benchmarks.external …

Two comparisons, each side by side in the same run, both sides warmed first (a batch and a
client run of twice the in-flight rows each), the order of the two sides alternating from
round to round:

1. **A real upstream**: `transformers serve` with continuous batching on (the configuration
   tests/inference/upstreams.py starts: CPU, a bounded K/V cache), serving the demo model of
   `--model-size` built locally. (a) Boardwalk: a batch of `--rows` chat rows (`--max-tokens`
   each, small so that a round on the CPU upstream takes seconds, not minutes) on an external
   revision (`manage.py model add … --engine-url`) whose `max_in_flight` is `--in-flight`
   (32, `model add`'s default); (b) a client posting the same bodies (model replaced, as
   Boardwalk sends them) with `httpx2`, the HTTP client Boardwalk's own is built on,
   `--in-flight` requests at once, in this process. Goal: (a) >= 0.9x (b).
2. **The dispatch ceiling**: the same against a server in this file (`--instant-server`, a
   subprocess: stdlib asyncio, HTTP/1.1 keep-alive) that answers every
   `POST /v1/chat/completions` at once with a fixed chat.completion with usage, and
   `GET /v1/models`: `--ceiling-rows` rows, max_in_flight `--ceiling-in-flight`. A batch
   holds at most 1,000 rows (docs/API.md), so Boardwalk's side is that many batches of up
   to 1,000 rows, created one after the other at once, each by its own organization (one
   has at most 4 unfinished batches). Goal: (a) >= 1,000 rows/s.

Boardwalk's side is timed from the first `POST /v1/batches` (the files are uploaded before,
and their prompt tokens counted, untimed) to the last batch's `completed_at`, finalization
(the output file) included; its phases come from the rows' own stamps: create (the requests,
the rows' insertion, the wake-up) up to the first row's `started_at`, dispatch from there to
the last row's `completed_at` (the dispatch-only rate), and finalize from there to the last
`completed_at`. The direct client is timed from its first request to its last answer.
Beside each figure: the CPU seconds per wall second of the process that dispatched (the
worker's; the client's) and of the upstream server, since on a small machine they share the
cores, and the dispatcher's CPU milliseconds a row; on the embedded default also the worker's
CPU a row by thread (`external-engine`: the HTTP requests and the in-flight limit; `prepare`:
claims and preparation; `record`; `finalizer`; `MainThread`: this script's requests and
polling; `Thread`: Dramatiq's, which runs the engine loop).

The dispatchers (this process with its client, the worker) are pinned to the first CPU and
the upstream to the others (`--no-pin`: neither), so that on a small machine the worker's CPU
is not taken from the upstream's, as on a fleet where the upstream has machines of its own.

The embedded default (SQLite, the in-process worker of `manage.py serve`: one Dramatiq worker
thread in this process) unless `--postgres`: then PostgreSQL (a scratch database,
`boardwalk_bench_external` on 127.0.0.1:5432, made afresh each run) and Redis (db 5), with one
`manage.py run_worker --threads 1` process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

POSTGRES_URL = "postgres://postgres@127.0.0.1:5432/boardwalk_bench_external"
REDIS_URL = "redis://127.0.0.1:6379/5"
SERVE_GOAL = 0.9  # Boardwalk / direct on the real upstream (issue 41)
CEILING_GOAL = 1000.0  # rows/s through one worker against an instant upstream (issue 41)
PRICES = ("--price-input", "150000", "--price-cached-input", "75000", "--price-output", "600000")


# -- the instant upstream ----------------------------------------------------------------------

_ANSWER = (
    b'{"id":"chatcmpl-instant","object":"chat.completion","created":1700000000,'
    b'"model":"instant","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,'
    b'"total_tokens":13}}'
)
_MODELS = b'{"object":"list","data":[{"id":"instant","object":"model","owned_by":"bench"}]}'


def _response(status: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


_RESPONSES = {
    (b"POST", b"/v1/chat/completions"): _response(b"200 OK", _ANSWER),
    (b"GET", b"/v1/models"): _response(b"200 OK", _MODELS),
}
_NOT_FOUND = _response(b"404 Not Found", b'{"detail":"Not Found"}')


class _InstantProtocol(asyncio.Protocol):
    """One keep-alive connection: each whole request (headers, then content-length bytes)
    answered at once, in order."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            lines = self.buffer[:head_end].split(b"\r\n")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            end = head_end + 4 + length
            if len(self.buffer) < end:
                return
            self.buffer = self.buffer[end:]
            method, path = [*lines[0].split(b" "), b"", b""][:2]
            self.transport.write(_RESPONSES.get((method, path), _NOT_FOUND))


def instant_server(port: int) -> None:
    """Serve until killed (the benchmark's subprocess)."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_InstantProtocol, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(run())


@contextlib.contextmanager
def instant_upstream(log_dir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    from tests.inference.upstreams import free_port

    port = free_port()
    with (log_dir / "instant.log").open("wb") as log:
        process = subprocess.Popen(  # noqa: S603 (this file, with this interpreter)
            [sys.executable, str(Path(__file__).resolve()), "--instant-server", str(port)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for(port, process)
        yield f"http://127.0.0.1:{port}/v1", process
    finally:
        process.terminate()
        process.wait(timeout=10)


def _wait_for(port: int, process: subprocess.Popen[bytes]) -> None:
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up:
        if process.poll() is not None:
            raise SystemExit("the instant server exited")
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            connection.request("GET", "/v1/models")
            if connection.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.1)
        finally:
            connection.close()
    raise SystemExit("the instant server did not start")


# -- measuring ---------------------------------------------------------------------------------


def pin(pid: int, cpus: set[int] | None) -> None:
    """Every thread of process `pid` (and the threads they start) on `cpus`; None: no pin."""
    if cpus is None:
        return
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), cpus)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ThreadClock:
    """CPU seconds by thread name (digits dropped) of this process's Python threads over a
    round: sampled at its start, while it runs (`sample`, so that threads which end before it
    does are counted up to their last sample) and at its end."""

    def __init__(self) -> None:
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.began = cpu_seconds(os.getpid())
        self.sample(start=True)

    def sample(self, *, start: bool = False) -> None:
        for thread in threading.enumerate():
            tid = thread.native_id
            if tid is None:
                continue
            try:
                fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1]
            except OSError:
                continue
            cpu = sum(int(f) for f in fields.split()[11:13]) / os.sysconf("SC_CLK_TCK")
            if start:
                self.first[tid] = cpu
            self.last[tid] = cpu
            self.names[tid] = thread.name.rstrip("0123456789-") or "thread"

    def by_name(self) -> dict[str, float]:
        """CPU seconds of each thread name, and `other` (threads not sampled, C threads)."""
        self.sample()
        found: dict[str, float] = {}
        for tid, cpu in self.last.items():
            name = self.names[tid]
            found[name] = found.get(name, 0.0) + cpu - self.first.get(tid, 0.0)
        found["other"] = max(0.0, cpu_seconds(os.getpid()) - self.began - sum(found.values()))
        return found


@dataclass
class Timed:
    seconds: float
    rows: int
    cpu: float  # CPU seconds per wall second of the dispatching process
    upstream_cpu: float  # the same, of the upstream server
    cpu_total: float  # CPU seconds of the dispatching process over the round
    phases: tuple[float, float, float] | None = None  # create, dispatch, finalize (Boardwalk)
    threads: dict[str, float] | None = None  # CPU seconds by thread (an in-process worker)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds

    @property
    def dispatch_rate(self) -> float | None:
        return self.rows / self.phases[1] if self.phases else None


def measured(run: Callable[[ThreadClock], tuple[float, int, Any]], pids: tuple[int, int]) -> Timed:
    """`run` returns (seconds, rows, phases); CPU of (dispatcher, upstream) over its wall
    time, and this process's by thread."""
    before = [cpu_seconds(pid) for pid in pids]
    clock = ThreadClock()
    began = time.perf_counter()
    seconds, rows, phases = run(clock)
    wall = time.perf_counter() - began
    threads = clock.by_name()
    used = [cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True)]
    return Timed(seconds, rows, used[0] / wall, used[1] / wall, used[0], phases, threads)


def direct(url: str, bodies: list[bytes], concurrency: int) -> tuple[float, int, None]:
    """A client at `concurrency`: that many requests in flight while rows remain; each answer
    must be a chat completion. `httpx2`'s line per request is not logged for it (a worker in
    this process still logs its own, as the settings say)."""
    quiet = logging.getLogger("httpx2")
    quiet.disabled = True
    try:
        return asyncio.run(_direct(url, bodies, concurrency))
    finally:
        quiet.disabled = False


async def _direct(url: str, bodies: list[bytes], concurrency: int) -> tuple[float, int, None]:
    import httpx2
    import orjson

    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"content-type": "application/json", "accept": "application/json"}
    async with httpx2.AsyncClient(
        headers=headers, limits=limits, timeout=300.0, trust_env=False
    ) as http:
        source = iter(bodies)
        answered = 0

        async def sender() -> None:
            nonlocal answered
            for body in source:
                response = await http.post(f"{url}/chat/completions", content=body)
                if response.status_code != 200 or "choices" not in orjson.loads(response.content):
                    raise SystemExit(f"the upstream answered {response.status_code}")
                answered += 1

        began = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(concurrency)))
        return time.perf_counter() - began, answered, None


# -- the benchmark -------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000, help="rows for the real upstream")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=8, help="each row's max tokens")
    parser.add_argument("--model-size", default="tiny", choices=["tiny", "bench"])
    parser.add_argument("--in-flight", type=int, default=32, help="the real upstream's cap")
    parser.add_argument("--ceiling-rows", type=int, default=5000)
    parser.add_argument("--ceiling-in-flight", type=int, default=32)
    parser.add_argument("--skip-serve", action="store_true", help="only the dispatch ceiling")
    parser.add_argument("--skip-ceiling", action="store_true", help="only the real upstream")
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL + Redis, run_worker")
    parser.add_argument(
        "--no-pin", action="store_true", help="leave the dispatchers and the upstream unpinned"
    )
    parser.add_argument("--instant-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.instant_server:
        instant_server(args.instant_server)
        return
    if args.rounds < 1 or args.rows < 1 or args.ceiling_rows < 1:
        raise SystemExit("--rounds, --rows and --ceiling-rows must be at least 1")
    data_dir = Path(tempfile.mkdtemp(prefix="boardwalk-external-"))
    os.environ["BOARDWALK_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("BOARDWALK_MAX_QUEUED_ITEMS", "1000000")
    if args.postgres:
        _production_environment()
    else:
        for name in ("DATABASE_URL", "REDIS_URL"):  # the embedded default
            os.environ.pop(name, None)

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    bench = Bench(args, data_dir)
    with bench.worker():
        shape = bench.shape()
        if not args.skip_serve:
            print("\n".join([shape, *bench.compare_served()]), flush=True)
        if not args.skip_ceiling:
            print("\n".join([shape, *bench.compare_instant()]), flush=True)
    print(f"load average {_load()} at the end (1, 5, 15 minutes)")
    shutil.rmtree(data_dir, ignore_errors=True)


def _production_environment() -> None:
    """PostgreSQL + Redis for this process and its worker: a scratch database (dropped and
    made afresh), Redis db 5, and secrets made for the run (docs/DEPLOYMENT.md)."""
    import base64
    import secrets

    import psycopg

    with psycopg.connect(POSTGRES_URL.rsplit("/", 1)[0] + "/postgres", autocommit=True) as db:
        name = POSTGRES_URL.rsplit("/", 1)[1]
        db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        db.execute(f'CREATE DATABASE "{name}"')
    os.environ.update(
        DATABASE_URL=POSTGRES_URL,
        REDIS_URL=REDIS_URL,
        BOARDWALK_BROKER_NAMESPACE="boardwalk-bench-external",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        BOARDWALK_MASTER_KEYS="k1:" + base64.b64encode(secrets.token_bytes(32)).decode(),
        BOARDWALK_API_KEY_PEPPER=secrets.token_urlsafe(32),
    )


class Bench:
    def __init__(self, args: argparse.Namespace, data_dir: Path) -> None:
        from django.core.management import call_command
        from rest_framework.test import APIClient

        from inference.models import CatalogModel

        self.args = args
        self.data_dir = data_dir
        with open(os.devnull, "w") as quiet:
            call_command("bootstrap_demo", "--json", "--model-size", args.model_size, stdout=quiet)
        self.auths: list[dict[str, str]] = []
        self.client = APIClient()
        # The dispatchers (this process, the worker) on the first CPU, the upstream on the
        # others: as on a fleet, the worker's CPU is not taken from the upstream's.
        cpus = sorted(os.sched_getaffinity(0))
        pinned = not args.no_pin and len(cpus) > 1
        self.dispatch_cpus = {cpus[0]} if pinned else None
        self.upstream_cpus = set(cpus[1:]) if pinned else None
        pin(os.getpid(), self.dispatch_cpus)
        self.model_dir = Path(CatalogModel.objects.get(name="boardwalk/tiny-chat").revision.weights)
        self.worker_pid = os.getpid()

    def auth(self, position: int) -> dict[str, str]:
        """The credentials of the organization whose turn `position` is: each batch of a
        round has its own (an organization has at most 4 unfinished batches, docs/API.md)."""
        from billing.services import credit_grant
        from boardwalk.models import Organization
        from boardwalk.services import api_key_create, org_create

        while len(self.auths) <= position:
            name = "demo" if not self.auths else f"bench-{len(self.auths)}"
            org = Organization.objects.filter(name=name).first() or org_create(name=name)
            credit_grant(org=org, amount_microusd=10**13, memo="external-engine benchmark")
            key = api_key_create(org=org, scopes="inference:write,requests:read", name="bench")
            self.auths.append({"HTTP_AUTHORIZATION": f"Bearer {key.secret}"})
        return self.auths[position]

    def shape(self) -> str:
        stack = (
            "PostgreSQL + Redis, one `manage.py run_worker --threads 1` process"
            if self.args.postgres
            else "embedded default (SQLite, the in-process worker: one Dramatiq thread)"
        )
        pinned = (
            f"dispatchers pinned to CPU {min(self.dispatch_cpus)}, the upstream to the others"
            if self.dispatch_cpus
            else "nothing pinned"
        )
        return (
            f"{stack}; {os.cpu_count()} CPUs, {pinned}; load average {_load()} at the start; "
            f"medians of {self.args.rounds} rounds"
        )

    @contextlib.contextmanager
    def worker(self) -> Iterator[None]:
        if not self.args.postgres:
            from project.worker_runtime import WorkerRuntime

            runtime = WorkerRuntime(threads=1).start()
            try:
                yield
            finally:
                runtime.stop()
            return
        from boardwalk.broker import setup_broker

        setup_broker().flush_all()
        log_path = self.data_dir / "worker.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "manage.py", "run_worker", "--threads", "1"],
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            while b"worker ready" not in log_path.read_bytes():
                if process.poll() is not None:
                    raise SystemExit(f"the worker exited:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.2)
            self.worker_pid = process.pid
            pin(process.pid, self.dispatch_cpus)
            yield
        finally:
            process.terminate()
            process.wait(timeout=30)

    # -- the two comparisons -----------------------------------------------------------------

    def compare_served(self) -> list[str]:
        from tests.inference.upstreams import serve

        args = self.args
        tokenizer_dir = self.data_dir / "tokenizer"
        shutil.copytree(
            self.model_dir, tokenizer_dir, ignore=shutil.ignore_patterns("*.safetensors")
        )
        with serve(self.model_dir, self.data_dir) as served:
            pin(served.process.pid, self.upstream_cpus)
            name = self.revision(
                "bench/served", served.url, served.model, tokenizer_dir, args.in_flight
            )
            boardwalk, client = self.rounds(
                name,
                served.url,
                served.model,
                served.process.pid,
                rows=args.rows,
                in_flight=args.in_flight,
            )
        ratio = statistics.median(t.rate for t in boardwalk) / statistics.median(
            t.rate for t in client
        )
        by_round = statistics.median(
            b.rate / c.rate for b, c in zip(boardwalk, client, strict=True)
        )
        verdict = "met" if ratio >= SERVE_GOAL else "missed"
        return [
            "",
            f"1. transformers serve --continuous-batching (CPU, {args.model_size} model), "
            f"{args.rows} rows of max_tokens {args.max_tokens}, {args.in_flight} in flight",
            *_table(boardwalk, client, not self.args.postgres),
            f"Boardwalk / direct: {ratio:.2f}x (median of each round's ratio {by_round:.2f}x); "
            f"goal >= {SERVE_GOAL}x: {verdict}",
        ]

    def compare_instant(self) -> list[str]:
        args = self.args
        with instant_upstream(self.data_dir) as (url, process):
            pin(process.pid, self.upstream_cpus)
            name = self.revision(
                "bench/instant", url, "instant", self.model_dir, args.ceiling_in_flight
            )
            boardwalk, client = self.rounds(
                name,
                url,
                "instant",
                process.pid,
                rows=args.ceiling_rows,
                in_flight=args.ceiling_in_flight,
            )
        rate = statistics.median(t.rate for t in boardwalk)
        verdict = "met" if rate >= CEILING_GOAL else "missed"
        return [
            "",
            f"2. dispatch ceiling: an upstream that answers at once, {args.ceiling_rows} rows, "
            f"{args.ceiling_in_flight} in flight",
            *_table(boardwalk, client, not self.args.postgres),
            f"Boardwalk, batch create to completed: {rate:.0f} rows/s; goal >= "
            f"{CEILING_GOAL:.0f} rows/s: {verdict}",
        ]

    def revision(self, name: str, url: str, model: str, tokenizer: Path, in_flight: int) -> str:
        import io

        from django.core.management import call_command

        out = io.StringIO()
        call_command(
            "model", "--json", "add", name, "--engine-url", url, "--engine-model", model,
            "--tokenizer", str(tokenizer), "--max-in-flight", str(in_flight), *PRICES,
            stdout=out,
        )  # fmt: skip
        return name

    def rounds(
        self, name: str, url: str, model: str, upstream_pid: int, *, rows: int, in_flight: int
    ) -> tuple[list[Timed], list[Timed]]:
        """Both sides warmed, then `--rounds` rounds, the first side alternating."""
        import orjson

        bodies = [_body(name, i, self.args.max_tokens) for i in range(rows)]
        sent = [orjson.dumps({**body, "model": model}) for body in bodies]
        warm = min(rows, 2 * in_flight)
        self.batches(self.upload(bodies[:warm]))
        direct(url, sent[:warm], in_flight)

        def boardwalk() -> Timed:
            files = self.upload(bodies)  # untimed; a batch deletes its input file
            return measured(
                lambda clock: self.batches(files, clock), (self.worker_pid, upstream_pid)
            )

        def client() -> Timed:
            return measured(lambda _: direct(url, sent, in_flight), (os.getpid(), upstream_pid))

        ours: list[Timed] = []
        theirs: list[Timed] = []
        for round_ in range(self.args.rounds):
            if round_ % 2 == 0:
                ours.append(boardwalk())
                theirs.append(client())
            else:
                theirs.append(client())
                ours.append(boardwalk())
        return ours, theirs

    def upload(self, bodies: list[dict[str, Any]]) -> list[tuple[dict[str, str], str]]:
        """The rows as input files of at most MAX_INPUT_LINES lines each (docs/API.md), each
        of its own organization: (credentials, file id)."""
        import io

        import orjson

        from files.limits import MAX_INPUT_LINES

        ids = []
        for start in range(0, len(bodies), MAX_INPUT_LINES):
            data = b"".join(
                orjson.dumps(
                    {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                     "body": body}
                )
                + b"\n"
                for i, body in enumerate(bodies[start : start + MAX_INPUT_LINES], start)
            )  # fmt: skip
            named = io.BytesIO(data)
            named.name = "rows.jsonl"
            auth = self.auth(len(ids))
            upload = self.client.post(
                "/v1/files", {"file": named, "purpose": "batch"}, format="multipart", **auth
            )
            if upload.status_code != 200:
                raise SystemExit(f"upload answered {upload.status_code}: {upload.content[:300]!r}")
            ids.append((auth, str(upload.json()["id"])))
        _counted([file_id for _, file_id in ids])
        return ids

    def batches(
        self, files: list[tuple[dict[str, str], str]], clock: ThreadClock | None = None
    ) -> tuple[float, int, tuple[float, float, float]]:
        """Batches of these files, created one after the other at once, from the first create
        request to the last `completed_at`; every row must have succeeded. (seconds, rows,
        (create, dispatch, finalize) seconds)."""
        import orjson
        from django.db.models import Count, Max, Min, Q

        from batches.models import Batch, BatchItem

        began = time.time()  # the wall clock the worker stamps completed_at with
        ids = []
        for auth, file_id in files:
            created = self.client.generic(
                "POST",
                "/v1/batches",
                orjson.dumps(
                    {
                        "input_file_id": file_id,
                        "endpoint": "/v1/chat/completions",
                        "completion_window": "24h",
                    }
                ),
                content_type="application/json",
                HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
                **auth,
            )
            if created.status_code != 200:
                raise SystemExit(
                    f"batch create answered {created.status_code}: {created.content!r}"
                )
            ids.append(created.json()["id"])
        while Batch.objects.filter(id__in=ids, status__in=Batch.TERMINAL).count() < len(ids):
            time.sleep(0.1)
            if clock is not None:
                clock.sample()
        ends = []
        for batch in Batch.objects.filter(id__in=ids):
            if batch.completed_at is None:
                raise SystemExit(f"batch {batch.id} ended {batch.status}, not completed")
            ends.append(batch.completed_at.timestamp())
        stamps = BatchItem.objects.filter(batch_id__in=ids).aggregate(
            first=Min("started_at"),
            last=Max("completed_at"),
            rows=Count("id"),
            failed=Count("id", filter=~Q(error_code="")),
        )
        if stamps["failed"]:
            codes = (
                BatchItem.objects.filter(batch_id__in=ids)
                .exclude(error_code="")
                .values_list("error_code")
                .annotate(rows=Count("id"))
            )
            raise SystemExit(f"{stamps['failed']} of {stamps['rows']} rows failed: {dict(codes)}")
        first, last, end = stamps["first"].timestamp(), stamps["last"].timestamp(), max(ends)
        return end - began, stamps["rows"], (first - began, last - first, end - last)


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _counted(file_ids: list[str], seconds: float = 120.0) -> None:
    """Wait for the worker to count the files' prompt tokens (files.counting), so that no
    count runs beside a timed round."""
    from files.models import File

    give_up = time.monotonic() + seconds
    while File.objects.filter(id__in=file_ids, prompt_tokens__isnull=True).exists():
        if time.monotonic() > give_up:
            print("warning: prompt tokens not counted yet; timing anyway", file=sys.stderr)
            return
        time.sleep(0.05)


def _body(model: str, i: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"Question {i}: " + "why " * (i % 7)}],
        "max_completion_tokens": max_tokens,
        "temperature": 0,
    }


def _table(boardwalk: list[Timed], client: list[Timed], in_process: bool) -> list[str]:
    def median(values: Iterator[float]) -> float:
        return statistics.median(values)

    def runs(timed: list[Timed]) -> str:
        return " ".join(f"{t.rate:.0f}" for t in timed)

    def cpu(timed: list[Timed]) -> str:
        return (
            f"CPU/s {median(t.cpu for t in timed):.2f} dispatcher, "
            f"{median(t.upstream_cpu for t in timed):.2f} upstream; "
            f"{median(1000 * t.cpu_total / t.rows for t in timed):.2f} CPU ms a row"
        )

    phases = [t.phases for t in boardwalk if t.phases]
    create, dispatch, finalize = (median(p[i] for p in phases) for i in range(3))
    lines = [
        f"  {'Boardwalk (create -> completed)':<36} {median(t.rate for t in boardwalk):>6.0f} "
        f"rows/s   runs: {runs(boardwalk)}   ({cpu(boardwalk)})",
        f"  {'  dispatch only (first -> last row)':<36} "
        f"{median(t.dispatch_rate or 0.0 for t in boardwalk):>6.0f} rows/s   phases "
        f"(median s): create {create:.2f}, dispatch {dispatch:.2f}, finalize {finalize:.2f}",
        f"  {'direct client, same concurrency':<36} {median(t.rate for t in client):>6.0f} "
        f"rows/s   runs: {runs(client)}   ({cpu(client)})",
    ]
    if in_process:
        names = sorted(
            {n for t in boardwalk for n in t.threads or {}},
            key=lambda n: -median((t.threads or {}).get(n, 0.0) for t in boardwalk),
        )
        shares = [
            f"{n} {median(1000 * (t.threads or {}).get(n, 0.0) / t.rows for t in boardwalk):.2f}"
            for n in names
        ]
        lines.append("  Boardwalk's CPU ms a row by thread: " + ", ".join(shares))
    return lines


if __name__ == "__main__":
    main()
