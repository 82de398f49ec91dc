"""Scale-out benchmark (issue 6): items/s with 1, 2, 4, 8 worker processes.

PostgreSQL + Redis + real `manage.py run_worker` processes, and a fake engine whose steps
take a fixed time (BOARDWALK_ENGINE_BACKEND=fake:<ms>): the figure measures coordination —
claims, leases, record transactions, wake-ups — not the CPU. For each worker count it
uploads a 1,000-line file, creates a batch, and times the items from the first claim to the
last result; with --kill (default) one worker is `kill -9`'d once 30% of the items are done
(when there are at least two). Then it checks the published files: every custom_id exactly
once (duplicates and lost are counted, both must be 0).

    DATABASE_URL=postgres://… REDIS_URL=redis://… .venv/bin/python benchmarks/scale.py \
        [--workers 1,2,4,8] [--items 1000] [--step-ms 50] [--max-tokens 16] [--no-kill]

The database named by DATABASE_URL is migrated and gets a demo org; use a scratch one.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16, help="engine rows per worker")
    parser.add_argument("--no-kill", action="store_true")
    args = parser.parse_args()
    if not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
        sys.exit("scale.py needs DATABASE_URL (PostgreSQL) and REDIS_URL")
    data_dir = Path(tempfile.mkdtemp(prefix="boardwalk-scale-"))
    os.environ["BOARDWALK_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("BOARDWALK_MAX_QUEUED_ITEMS", "1000000")

    import django

    django.setup()
    import orjson
    from django.conf import settings
    from django.core.management import call_command
    from django.utils import timezone
    from rest_framework.test import APIClient

    from batches.models import Batch, BatchItem
    from billing.services import credit_grant
    from boardwalk.broker import setup_broker
    from boardwalk.models import Organization
    from boardwalk.services import api_key_create

    call_command("migrate", verbosity=0)
    with open(os.devnull, "w") as quiet:
        call_command("bootstrap_demo", "--json", stdout=quiet)
    org = Organization.objects.get(name="demo")
    credit_grant(org=org, amount_microusd=10**12, memo="scale benchmark")
    key = api_key_create(org=org, scopes="inference:write,requests:read", name="scale").secret
    client = APIClient()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    broker = setup_broker()
    env = dict(os.environ)
    env.update(
        BOARDWALK_MASTER_KEYS=settings.MASTER_KEYS,
        BOARDWALK_API_KEY_PEPPER=settings.API_KEY_PEPPER,
        DJANGO_SECRET_KEY=settings.SECRET_KEY,
        BOARDWALK_ENGINE_BACKEND=f"fake:{args.step_ms}",
        BOARDWALK_ENGINE_MAX_BATCH_SIZE=str(args.batch_size),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
    )

    def start(name: str) -> subprocess.Popen:
        log = (data_dir / f"{name}.log").open("w")
        return subprocess.Popen(
            [sys.executable, "manage.py", "run_worker", "--threads", "1"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(name: str) -> None:
        while b"worker ready" not in (data_dir / f"{name}.log").read_bytes():
            time.sleep(0.2)

    lines = b"".join(
        orjson.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "boardwalk/tiny-chat",
                    "messages": [{"role": "user", "content": f"Question {i}"}],
                    "max_completion_tokens": args.max_tokens,
                },
            }
        )
        + b"\n"
        for i in range(args.items)
    )
    print(
        f"{args.items} items, fake engine: {args.step_ms} ms/step, {args.max_tokens} tokens each, "
        f"{args.batch_size} rows per worker; kill -9 of one worker at 30%: {not args.no_kill}"
    )

    def submit(content: bytes) -> str:
        upload = client.post(
            "/v1/files", {"file": _named(content), "purpose": "batch"}, format="multipart", **auth
        )
        created = client.generic(
            "POST",
            "/v1/batches",
            orjson.dumps(
                {
                    "input_file_id": upload.json()["id"],
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "24h",
                }
            ),
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
            **auth,
        )
        return created.json()["id"]

    print(
        f"{'workers':>7} {'seconds':>8} {'items/s':>8} {'speed-up':>8} {'dup':>4} {'lost':>5}"
        f" {'re-claim s':>10}"
    )
    base = None
    for count in [int(n) for n in args.workers.split(",")]:
        broker.flush_all()
        names = [f"w{count}-{i}" for i in range(count)]
        workers = [start(name) for name in names]
        for name in names:
            wait_ready(name)
        # Warm-up (not timed): every worker loads its engine (here: the tokenizer).
        warm = b"".join(lines.splitlines(keepends=True)[: count * 2 * args.batch_size])
        warm_id = submit(warm)
        while not Batch.objects.get(id=warm_id).is_terminal:
            time.sleep(0.2)
        batch_id = submit(lines)
        items = BatchItem.objects.filter(batch_id=batch_id)
        killed = args.no_kill or count < 2
        killed_at = None
        while True:
            batch = Batch.objects.get(id=batch_id)
            if batch.is_terminal:
                break
            if not killed and items.filter(state="succeeded").count() >= args.items * 0.3:
                os.kill(workers[0].pid, signal.SIGKILL)
                killed_at = timezone.now()
                killed = True
            time.sleep(0.2)
        first = items.order_by("started_at").values_list("started_at", flat=True).first()
        last = items.order_by("-completed_at").values_list("completed_at", flat=True).first()
        seconds = (last - first).total_seconds() if first and last else float("nan")
        ids = _custom_ids(client, auth, batch.output_file_id) + _custom_ids(
            client, auth, batch.error_file_id
        )
        recovery = "-"
        retried = items.filter(attempts__gte=2).order_by("started_at").first()
        if killed_at is not None and retried is not None and retried.started_at:
            # From the kill to the first re-claim of one of the victim's items.
            recovery = f"{(retried.started_at - killed_at).total_seconds():.1f}"
        duplicates = len(ids) - len(set(ids))
        lost = args.items - len(set(ids))
        rate = args.items / seconds
        base = base or rate
        print(
            f"{count:>7} {seconds:>8.2f} {rate:>8.1f} {rate / base:>7.2f}x "
            f"{duplicates:>4} {lost:>5} {recovery:>10}",
            flush=True,
        )
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()


def _named(data: bytes):
    import io

    f = io.BytesIO(data)
    f.name = "scale.jsonl"
    return f


def _custom_ids(client, auth, file_id: str | None) -> list[str]:
    import orjson

    if not file_id:
        return []
    response = client.get(f"/v1/files/{file_id}/content", **auth)
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return [orjson.loads(line)["custom_id"] for line in body.splitlines() if line]


if __name__ == "__main__":
    main()
