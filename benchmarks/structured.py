"""Generated tokens per second with and without structured outputs, on the same batch.

    .venv/bin/python benchmarks/structured.py [--model-dir DIR] [--requests 32] [--runs 5]

The same chat requests (fixed RNG, temperature 0.8, seeded) run through the Engine twice:
(a) free text, (b) half of the rows carrying a JSON schema (`response_format` json_schema,
masks from llguidance every step). The schema is open-ended (an array of strings), so the
random-weight "bench" demo model mostly runs to max_tokens in both; tokens/s counts the tokens
actually generated. Warmed up, median of --runs runs. Goal: (b) >= 0.9x (a).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inference.chat_completions import prompt_ids, sampling_params  # noqa: E402
from inference.demo.model import _CORPUS, build_demo_model  # noqa: E402
from inference.engine import Engine, EngineConfig, GenerationRequest, load_model  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["billing", "support", "sales"]},
        "notes": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["label", "notes"],
    "additionalProperties": False,
}


def make_bodies(count: int, seed: int, *, structured: bool) -> list[dict]:
    rng = random.Random(seed)
    words = _CORPUS.split()
    bodies = []
    for i in range(count):
        start = rng.randrange(len(words))
        text = " ".join(words[(start + j) % len(words)] for j in range(rng.choice([20, 40, 80])))
        body = {
            "messages": [{"role": "user", "content": text}],
            "max_completion_tokens": rng.randint(48, 96),
            "temperature": 0.8,
            "seed": i,
        }
        if structured and i % 2 == 0:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "ticket", "schema": SCHEMA},
            }
        bodies.append(body)
    return bodies


def run(engine: Engine, bodies: list[dict]) -> tuple[int, float]:
    requests = []
    for i, body in enumerate(bodies):
        params = sampling_params(body)
        params.ignore_eos = True  # free-text rows run to max_tokens; constrained rows may end
        requests.append(GenerationRequest(str(i), prompt_ids(engine.tokenizer, body), params))
    began = time.perf_counter()
    tokens = sum(r.completion_tokens for r in engine.generate(requests))
    return tokens, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=ROOT / "var" / "models" / "bench")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    model, tokenizer = load_model(str(build_demo_model(args.model_dir, size="bench")))
    engine = Engine(
        model, tokenizer, EngineConfig(context_length=2048, max_batch_size=args.batch_size)
    )
    plain = make_bodies(args.requests, 7, structured=False)
    mixed = make_bodies(args.requests, 7, structured=True)
    run(engine, plain[:4])  # warm up both paths (and build the token table once)
    run(engine, mixed[:4])

    rates: dict[str, list[float]] = {"plain": [], "half with schema": []}
    counts: dict[str, int] = {}
    for _ in range(args.runs):  # interleaved, so machine noise hits both alike
        for name, bodies in (("plain", plain), ("half with schema", mixed)):
            tokens, seconds = run(engine, bodies)
            rates[name].append(tokens / seconds)
            counts[name] = tokens
    base = statistics.median(rates["plain"])
    print(f"{args.requests} requests, batch {args.batch_size}, median of {args.runs} runs")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(
            f"  {name:<18} {rate:8.1f} tok/s  ({counts[name]} tokens)  "
            f"{rate / base:5.2f}x  [min {min(values):.1f}, max {max(values):.1f}]"
        )


if __name__ == "__main__":
    main()
