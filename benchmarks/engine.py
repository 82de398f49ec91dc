"""Generated tokens per second: our continuous-batching Engine against plain `model.generate`.

    .venv/bin/python benchmarks/engine.py [--model-dir DIR] [--requests 64] [--batch-size 32]

Runs the same chat requests (mixed prompt lengths, mixed max_tokens, fixed RNG) through
(a) one `model.generate` call per request (on a spread-out sample of them), (b) padded static
batches of 16 in input order, and (c) the Engine, on the "bench" demo model (built offline on
first use). Every request generates exactly its max_tokens in all three (end-of-sequence
suppressed), so the useful work is the same; tokens/s counts each request's max_tokens only.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from inference.demo_model import _CORPUS, build_demo_model  # noqa: E402
from inference.engine import (  # noqa: E402
    Engine,
    GenerationRequest,
    SamplingParams,
    load_model,
    render_prompt,
)

STATIC_BATCH = 16


def make_requests(tokenizer, count: int, seed: int) -> list[GenerationRequest]:
    rng = random.Random(seed)
    words = _CORPUS.split()
    requests = []
    for i in range(count):
        start = rng.randrange(len(words))
        length = rng.choice([8, 20, 40, 80, 160])
        text = " ".join(words[(start + j) % len(words)] for j in range(length))
        messages = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": text},
        ]
        params = SamplingParams(
            max_new_tokens=rng.randint(16, 128), temperature=0.0, ignore_eos=True
        )
        requests.append(GenerationRequest(str(i), render_prompt(tokenizer, messages), params))
    return requests


def run_single(model, requests) -> int:
    tokens = 0
    for r in requests:
        n = r.params.max_new_tokens
        out = model.generate(
            torch.tensor([r.prompt_ids]),
            attention_mask=torch.ones(1, len(r.prompt_ids), dtype=torch.long),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
        )
        assert out.shape[1] - len(r.prompt_ids) == n
        tokens += n
    return tokens


def run_static(model, tokenizer, requests) -> int:
    """Padded batches in input order: each batch runs until its longest max_tokens."""
    pad = tokenizer.pad_token_id
    tokens = 0
    for lo in range(0, len(requests), STATIC_BATCH):
        batch = requests[lo : lo + STATIC_BATCH]
        width = max(len(r.prompt_ids) for r in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids) :] = 1
        n = max(r.params.max_new_tokens for r in batch)
        model.generate(
            ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False
        )
        # Only each request's own max_tokens is useful output; the rest is the padding cost.
        tokens += sum(r.params.max_new_tokens for r in batch)
    return tokens


def run_engine(engine: Engine, requests) -> int:
    tokens = 0
    for result in engine.generate(iter(requests)):
        wanted = requests[int(result.id)].params.max_new_tokens
        assert result.error is None and result.completion_tokens == wanted
        tokens += result.completion_tokens
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=ROOT / "var/models/tiny-chat-bench")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32, help="Engine max_batch_size")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--rounds", type=int, default=2, help="best of this many runs each")
    parser.add_argument(
        "--single-sample",
        type=int,
        default=16,
        help="(a) runs every k-th request only, k = requests / this (0: skip (a))",
    )
    args = parser.parse_args()

    model_dir = build_demo_model(args.model_dir, size="bench")
    model, tokenizer = load_model(str(model_dir))
    params = sum(p.numel() for p in model.parameters())
    requests = make_requests(tokenizer, args.requests, args.seed)
    prompt_lengths = sorted(len(r.prompt_ids) for r in requests)
    print(
        f"model {model_dir.name}: {params / 1e6:.1f}M params, {model.dtype}, "
        f"torch threads {torch.get_num_threads()}; {len(requests)} requests, prompt tokens "
        f"{prompt_lengths[0]}..{prompt_lengths[-1]}, max_tokens 16..128, "
        f"{sum(r.params.max_new_tokens for r in requests)} tokens to generate",
        flush=True,
    )
    engine = Engine(model, tokenizer, context_length=2048, max_batch_size=args.batch_size)
    # Warm-up: first calls pay one-off allocation and kernel selection costs.
    run_engine(engine, requests[:4])

    runs = {
        "(b) static batches of 16": lambda: run_static(model, tokenizer, requests),
        f"(c) engine, batch {args.batch_size}": lambda: run_engine(engine, requests),
    }
    if args.single_sample:
        # One request at a time does not depend on its neighbours: a spread-out sample gives
        # its rate without spending minutes on all of them.
        sample = requests[:: max(1, len(requests) // args.single_sample)]
        runs = {
            f"(a) one at a time ({len(sample)} req)": lambda: run_single(model, sample),
            **runs,
        }
    # Rounds alternate the methods and each keeps its best: on a shared machine, other
    # processes slow some runs down, and this way no method pays for them alone.
    best: dict[str, float] = dict.fromkeys(runs, 0.0)
    for round_ in range(1, args.rounds + 1):
        for name, run in runs.items():
            began = time.perf_counter()
            with torch.inference_mode():
                tokens = run()
            seconds = time.perf_counter() - began
            best[name] = max(best[name], tokens / seconds)
            print(
                f"round {round_} {name:30} {tokens:6d} tokens {seconds:6.1f} s "
                f"{tokens / seconds:7.1f} tok/s",
                flush=True,
            )
    print("best of rounds:")
    for name, rate in best.items():
        print(f"  {name:30} {rate:7.1f} tok/s")
    engine_rate = best[next(n for n in best if n.startswith("(c)"))]
    for name, rate in best.items():
        if not name.startswith("(c)"):
            print(f"engine / {name[:3]}: {engine_rate / rate:.2f}x")


if __name__ == "__main__":
    main()
