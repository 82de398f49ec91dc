"""The platform end to end against the engine alone (issue 6): generated tokens per second.

(Issue 6 names the script `platform.py`; a script named platform.py in this folder would
shadow the standard library's `platform` module for every benchmark here, torch included.)

    # embedded default (SQLite, in-process worker):
    .venv/bin/python benchmarks/platform_vs_engine.py [--model-size tiny|bench]
        [--requests 256] [--rounds 5]
    # PostgreSQL + Redis with a separate worker process:
    DATABASE_URL=… REDIS_URL=… .venv/bin/python benchmarks/platform_vs_engine.py …

Runs the same chat requests (mixed prompt lengths and max_tokens, fixed RNG, greedy) through
(a) the `Engine` alone, prompts already tokenized, and (b) the platform end to end: upload the
JSONL file, create the batch, let the worker run it (in-process on the embedded default, a
separate `manage.py run_worker` process on PostgreSQL + Redis), wait for finalization and
download the output. tok/s counts the completion tokens each path reports; the engine alone is
timed around `generate` only, the platform from the upload's first byte to the batch's
`completed_at`, plus the download (the client's 50 ms status poll is not counted). Median of
--rounds runs each, after one warm-up run of each. Prints the ratios, and against (c)
length-sorted static batches of --batch-size through `model.generate` on the same requests
(each batch runs to its longest max_tokens; a row's tokens count up to its own end).

`--sectioned` (embedded default only) instead runs requests that all share a ~500-token system
prompt through the platform three ways, alternating: as a BatchRouter sectioned file (the
prompt once, in a section), as a standard file (the prompt repeated on every line), and as the
standard file with the engine's prefix cache off (BOARDWALK_ENGINE_PREFIX_CACHE=false); the
prefix cache is emptied before every run, so each computes the shared prompt at least once.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")


def _bodies(count: int, seed: int) -> list[dict[str, Any]]:
    from inference.demo.model import _CORPUS

    rng = random.Random(seed)
    words = _CORPUS.split()
    bodies = []
    for _ in range(count):
        start = rng.randrange(len(words))
        length = rng.choice([8, 20, 40, 80, 160])
        text = " ".join(words[(start + j) % len(words)] for j in range(length))
        bodies.append(
            {
                "model": "boardwalk/tiny-chat",
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": text},
                ],
                "max_completion_tokens": rng.randint(16, 128),
                "temperature": 0,
            }
        )
    return bodies


def _shared_prefix_bodies(count: int, seed: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A ~500-token system prompt (tiny/bench tokenizer) and `count` short questions."""
    from inference.demo.model import _CORPUS

    section = {
        "model": "boardwalk/tiny-chat",
        "max_completion_tokens": 16,
        "temperature": 0,
        "messages": [{"role": "system", "content": " ".join(_CORPUS.split()[:420])}],
    }
    rng = random.Random(seed)
    requests = [
        {"messages": [{"role": "user", "content": f"Question {i}: {rng.random():.6f}?"}]}
        for i in range(count)
    ]
    return section, requests


def _sectioned_files(count: int, seed: int) -> tuple[bytes, bytes]:
    """The same requests as a sectioned file and as a standard one."""
    import orjson

    section, requests = _shared_prefix_bodies(count, seed)
    sectioned = [
        {"type": "header", "format": "batchrouter.sectioned.v1"},
        {"type": "section", "section_id": "s", "body": section},
    ] + [{"type": "request", "custom_id": f"r{i}", "body": r} for i, r in enumerate(requests)]
    standard = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {**section, "messages": section["messages"] + r["messages"]},
        }
        for i, r in enumerate(requests)
    ]
    return tuple(
        b"".join(orjson.dumps(row) + b"\n" for row in rows) for rows in (sectioned, standard)
    )  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-size", default="tiny", choices=["tiny", "bench"])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--sectioned", action="store_true", help="sectioned vs standard files")
    args = parser.parse_args()
    production = bool(os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"))
    data_dir = Path(tempfile.mkdtemp(prefix="boardwalk-platform-"))
    os.environ["BOARDWALK_DATA_DIR"] = str(data_dir)
    os.environ["BOARDWALK_ENGINE_MAX_BATCH_SIZE"] = str(args.batch_size)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import django

    django.setup()
    import orjson
    from django.conf import settings
    from django.core.management import call_command
    from rest_framework.test import APIClient

    from batches.models import Batch
    from billing.services import credit_grant
    from boardwalk.broker import setup_broker
    from boardwalk.models import Organization
    from boardwalk.services import api_key_create
    from inference.chat_completions import prompt_ids, sampling_params
    from inference.engine import Engine, EngineConfig, GenerationRequest
    from inference.models import CatalogModel
    from inference.runtime import _load

    call_command("migrate", verbosity=0)
    with open(os.devnull, "w") as quiet:
        call_command("bootstrap_demo", "--json", "--model-size", args.model_size, stdout=quiet)
    org = Organization.objects.get(name="demo")
    credit_grant(org=org, amount_microusd=10**12, memo="platform benchmark")
    key = api_key_create(org=org, scopes="inference:write,requests:read", name="bench").secret
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    client = APIClient()
    revision = CatalogModel.objects.get(name="boardwalk/tiny-chat").revision
    bodies = _bodies(args.requests, args.seed)
    jsonl = b"".join(
        orjson.dumps(
            {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        )
        + b"\n"
        for i, body in enumerate(bodies)
    )

    model, tokenizer = _load(revision)
    engine = Engine(
        model,
        tokenizer,
        EngineConfig(context_length=revision.context_length, max_batch_size=args.batch_size),
    )
    requests = [
        GenerationRequest(str(i), prompt_ids(tokenizer, b), sampling_params(b))
        for i, b in enumerate(bodies)
    ]

    def engine_alone() -> float:
        began = time.perf_counter()
        tokens = sum(r.completion_tokens for r in engine.generate(requests))
        return tokens / (time.perf_counter() - began)

    def static_batches() -> float:
        began = time.perf_counter()
        tokens = _static_batches(model, tokenizer, requests, args.batch_size)
        return tokens / (time.perf_counter() - began)

    worker: subprocess.Popen | None = None
    runtime = None
    if production:
        setup_broker().flush_all()
        env = dict(os.environ)
        env.update(
            BOARDWALK_MASTER_KEYS=settings.MASTER_KEYS,
            BOARDWALK_API_KEY_PEPPER=settings.API_KEY_PEPPER,
            DJANGO_SECRET_KEY=settings.SECRET_KEY,
            PYTHONUNBUFFERED="1",
        )
        log = (data_dir / "worker.log").open("w")
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "run_worker", "--threads", "1"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        while b"worker ready" not in (data_dir / "worker.log").read_bytes():
            time.sleep(0.2)
    else:
        from project.worker_runtime import WorkerRuntime

        runtime = WorkerRuntime(threads=1).start()

    def platform(data: bytes = jsonl, metadata: dict[str, str] | None = None) -> float:
        began = time.time()  # the wall clock the worker stamps completed_at with
        upload = client.post(
            "/v1/files", {"file": _named(data), "purpose": "batch"}, format="multipart", **auth
        )
        submission: dict[str, Any] = {
            "input_file_id": upload.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        if metadata:
            submission["metadata"] = metadata
        created = client.generic(
            "POST",
            "/v1/batches",
            orjson.dumps(submission),
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
            **auth,
        )
        batch_id = created.json()["id"]
        while not (batch := Batch.objects.get(id=batch_id)).is_terminal:
            time.sleep(0.05)
        downloading = time.perf_counter()
        response = client.get(f"/v1/files/{batch.output_file_id}/content", **auth)
        body = b"".join(response.streaming_content) if response.streaming else response.content
        # Up to the batch's completed_at, then the download: the client's polling interval
        # is its own choice (a webhook learns at once), not the platform's time; polling it
        # faster instead cost the two cores more than it saved.
        if batch.completed_at is None:
            raise SystemExit(f"batch {batch.id} ended {batch.status}, not completed")
        seconds = (batch.completed_at.timestamp() - began) + (time.perf_counter() - downloading)
        rows = [orjson.loads(line) for line in body.splitlines() if line]
        if len(rows) != data.count(b"\n") - (2 if metadata else 0):
            raise SystemExit(f"only {len(rows)} rows came back")
        tokens = sum(r["response"]["body"]["usage"]["completion_tokens"] for r in rows)
        return tokens / seconds

    if args.sectioned:
        if runtime is None:
            raise SystemExit("--sectioned runs on the embedded default only")
        _compare_sectioned(args, platform, revision)
        runtime.stop()
        return

    try:
        engine_alone()
        platform()  # warm-up: the worker loads the model
        static_batches()
        alone, through, static = [], [], []
        for _ in range(args.rounds):
            alone.append(engine_alone())
            through.append(platform())
            static.append(static_batches())
    finally:
        if runtime is not None:
            runtime.stop()
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
    shape = "PostgreSQL + Redis, separate worker process" if production else "embedded default"
    a, p = statistics.median(alone), statistics.median(through)
    print(f"model {args.model_size}, {args.requests} requests, {shape}; median of {args.rounds}")
    print(f"{'engine alone':<24} {a:>9.0f} tok/s   runs: " + " ".join(f"{x:.0f}" for x in alone))
    print(
        f"{'platform end to end':<24} {p:>9.0f} tok/s   runs: "
        + " ".join(f"{x:.0f}" for x in through)
    )
    print(
        f"{'static batches of ' + str(args.batch_size):<24} {statistics.median(static):>9.0f} "
        "tok/s   runs: " + " ".join(f"{x:.0f}" for x in static)
    )
    print(f"platform / engine: {p / a:.2f}x")
    print(f"platform / static batches: {p / statistics.median(static):.2f}x")
    # The machine's speed drifts between rounds (±10 % on a shared 2-core VM); each round runs
    # the three side by side, so the median of each round's own ratio cancels that drift.
    by_round = [x / y for x, y in zip(through, alone, strict=True)]
    by_static = [x / y for x, y in zip(through, static, strict=True)]
    print(
        f"median of each round's ratio: platform / engine {statistics.median(by_round):.2f}x, "
        f"platform / static batches {statistics.median(by_static):.2f}x"
    )


def _static_batches(model: Any, tokenizer: Any, requests: list[Any], width: int) -> int:
    """Length-sorted, left-padded static batches of `width` through `model.generate` (greedy,
    each batch runs to its longest max_tokens; a row's tokens count up to its own end)."""
    import torch

    eos = int(tokenizer.eos_token_id)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    order = sorted(requests, key=lambda r: len(r.prompt_ids))
    tokens = 0
    with torch.inference_mode():
        for lo in range(0, len(order), width):
            batch = order[lo : lo + width]
            longest = max(len(r.prompt_ids) for r in batch)
            ids = torch.full((len(batch), longest), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, r in enumerate(batch):
                ids[row, longest - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
                mask[row, longest - len(r.prompt_ids) :] = 1
            out = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=max(r.params.max_new_tokens for r in batch),
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=pad,
            )
            for row, r in enumerate(batch):
                made = out[row, longest:].tolist()[: r.params.max_new_tokens]
                tokens += made.index(eos) + 1 if eos in made else len(made)
    return tokens


def _compare_sectioned(args: argparse.Namespace, platform: Any, revision: Any) -> None:
    from django.conf import settings

    from inference.runtime import engine_drop, engine_for

    sectioned, standard = _sectioned_files(args.requests, args.seed)
    metadata = {"batchrouter_input_format": "sectioned.v1"}

    def run(data: bytes, meta: dict[str, str] | None, cache: bool) -> float:
        if cache != settings.ENGINE_PREFIX_CACHE:
            settings.ENGINE_PREFIX_CACHE = cache
            engine_drop(revision.id)  # the next wake-up builds the engine with the setting
        engine_for(revision).clear_prefix_cache()  # the worker is idle between batches
        return platform(data, meta)

    ways = {
        "sectioned file, prefix cache on": (sectioned, metadata, True),
        "standard file, prefix cache on": (standard, None, True),
        "standard file, prefix cache off": (standard, None, False),
    }
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(args.rounds + 1):
        for name, way in ways.items():
            rate = run(*way)
            if round_:
                rates[name].append(rate)
    print(
        f"model {args.model_size}, {args.requests} requests sharing a ~500-token system prompt, "
        f"embedded default; median of {args.rounds}"
    )
    medians = {name: statistics.median(found) for name, found in rates.items()}
    for name, found in rates.items():
        print(
            f"{name:<34} {medians[name]:>8.0f} tok/s   runs: " + " ".join(f"{x:.0f}" for x in found)
        )
    base = medians["standard file, prefix cache off"]
    same = medians["standard file, prefix cache on"]
    ours = medians["sectioned file, prefix cache on"]
    print(f"sectioned / standard (both cached): {ours / same:.2f}x")
    print(f"sectioned / standard without the prefix cache: {ours / base:.2f}x")


def _named(data: bytes):
    import io

    f = io.BytesIO(data)
    f.name = "platform.jsonl"
    return f


if __name__ == "__main__":
    main()
