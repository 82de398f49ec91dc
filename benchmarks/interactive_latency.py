"""Interactive time to first token through the platform, black-box, on the embedded default.

    .venv/bin/python benchmarks/interactive_latency.py [--chats 30] [--batch-rows 300]
        [--model-size tiny|bench]

What a client of `/v1/chat/completions` sees (issue 40's measurement: 37 ms alone, 157 ms p50
and 1.0 s worst beside a 300-row batch, before the engine core took its verbs): streamed chat
requests (greedy, 16 tokens), one at a time with a short pause between them, sent through the
API with the in-process worker of the embedded default (SQLite, one worker thread), timed from
the request to the first delta of its stream that carries text:

- (a) no batch running (after one warm-up chat, whose wake-up loads the model and starts the
  run that stays up for the next ones);
- (b) beside a batch of `--batch-rows` rows (max_tokens 64) that the worker is running.

Prints p50, p90 and worst of each phase. To compare with an older tree, copy this file into
that tree's benchmarks/ and run it there, back to back: both print the same lines.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
for name in ("DATABASE_URL", "REDIS_URL"):  # the embedded default
    os.environ.pop(name, None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-size", default="tiny", choices=["tiny", "bench"])
    parser.add_argument("--chats", type=int, default=30, help="chat requests in each phase")
    parser.add_argument("--batch-rows", type=int, default=300)
    parser.add_argument("--pause", type=float, default=0.1, help="seconds between chats")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    os.environ["BOARDWALK_DATA_DIR"] = tempfile.mkdtemp(prefix="boardwalk-interactive-")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import django

    django.setup()
    import orjson
    from django.core.management import call_command
    from rest_framework.test import APIClient

    from batches.models import Batch
    from billing.services import credit_grant
    from boardwalk.models import Organization
    from boardwalk.services import api_key_create
    from project.worker_runtime import WorkerRuntime

    call_command("migrate", verbosity=0)
    with open(os.devnull, "w") as quiet:
        call_command("bootstrap_demo", "--json", "--model-size", args.model_size, stdout=quiet)
    org = Organization.objects.get(name="demo")
    credit_grant(org=org, amount_microusd=10**12, memo="interactive latency benchmark")
    key = api_key_create(org=org, scopes="inference:write,requests:read", name="bench").secret
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    client = APIClient()
    model = "boardwalk/tiny-chat"
    rng = random.Random(args.seed)

    def chat() -> float:
        """Seconds from sending a streamed chat to its first content delta."""
        words = " ".join(rng.choice(["sea", "river", "hill", "road", "town"]) for _ in range(12))
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"Tell me about {words}."}],
            "max_completion_tokens": 16,
            "temperature": 0,
            "stream": True,
        }
        began = time.perf_counter()
        response = client.generic(
            "POST",
            "/v1/chat/completions",
            orjson.dumps(body),
            content_type="application/json",
            **auth,
        )
        if response.status_code != 200:
            raise SystemExit(f"chat answered {response.status_code}: {response.content[:200]!r}")
        first = None
        for chunk in response.streaming_content:
            if first is None and _has_text(chunk):
                first = time.perf_counter() - began
        if first is None:
            raise SystemExit("a chat stream carried no content")
        return first

    def submit_batch() -> str:
        lines = b"".join(
            orjson.dumps(
                {
                    "custom_id": f"r{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": model,
                        "messages": [{"role": "user", "content": f"Story {i}, please."}],
                        "max_completion_tokens": 64,
                        "temperature": 0,
                    },
                }
            )
            + b"\n"
            for i in range(args.batch_rows)
        )
        from django.core.files.uploadedfile import SimpleUploadedFile

        upload = client.post(
            "/v1/files",
            {"file": SimpleUploadedFile("rows.jsonl", lines), "purpose": "batch"},
            format="multipart",
            **auth,
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
        return str(created.json()["id"])

    def phase(chats: int) -> list[float]:
        times = []
        for _ in range(chats):
            times.append(chat())
            time.sleep(args.pause)
        return times

    runtime = WorkerRuntime(threads=1).start()
    try:
        chat()  # warm-up: the worker loads the model
        time.sleep(1.0)
        alone = phase(args.chats)
        batch_id = submit_batch()
        while Batch.objects.get(id=batch_id).status != "in_progress":
            time.sleep(0.05)
        time.sleep(1.0)  # the batch's rows fill the engine
        beside = phase(args.chats)
        status = Batch.objects.get(id=batch_id).status
    finally:
        runtime.stop()

    def line(name: str, values: list[float]) -> str:
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
        return (
            f"{name:<34} p50 {statistics.median(values) * 1e3:6.0f} ms   p90 {p90 * 1e3:6.0f} ms"
            f"   worst {max(values) * 1e3:6.0f} ms   ({len(values)} chats)"
        )

    print(f"model {args.model_size}, embedded default, 1 worker thread; tree {ROOT}")
    print(line("(a) no batch running", alone))
    print(line(f"(b) beside a {args.batch_rows}-row batch", beside))
    print(f"(b)/(a) p50 {statistics.median(beside) / statistics.median(alone):.2f}x")
    print(f"the batch was still {status} after phase (b)")


def _has_text(chunk: bytes) -> bool:
    """Whether a piece of the event stream carries generated text (the first event, the
    assistant's role with empty content, does not)."""
    import orjson

    for line in chunk.splitlines():
        if not line.startswith(b"data: {"):
            continue
        for choice in orjson.loads(line[len(b"data: ") :]).get("choices", []):
            if (choice.get("delta") or {}).get("content"):
                return True
    return False


if __name__ == "__main__":
    main()
