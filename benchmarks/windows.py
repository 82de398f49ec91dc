"""Blocks given back out of the window: a model whose every layer has a sliding window, with
and without the engine giving a sequence's leading blocks back once no layer reads them.

A Mistral-shaped random-weight model (4 layers, 8 query heads, 2 K/V heads, a `--window`-token
window), `--rows` requests of `--prompt` tokens each generating `--tokens` (greedy, no end of
sequence), and a key/value pool that holds `--fit` of the rows at full length. Both engines run
in this process, alternating, `--rounds` times; each line gives output tok/s, the most blocks
held at once and how many times a row was preempted (its blocks given back and recomputed
later). The two must generate the same tokens (checked: a block given back was never read).

    .venv/bin/python benchmarks/windows.py [--rows 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers as tf  # noqa: E402

from inference.demo.model import build_demo_model  # noqa: E402
from inference.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, load_model  # noqa: E402

BLOCK = 16


def build_model(vocab: int, window: int, context: int) -> Any:
    torch.manual_seed(0)
    config = tf.MistralConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=context,
        sliding_window=window,
        initializer_range=0.3,
        attn_implementation="sdpa",
    )
    return tf.MistralForCausalLM(config).eval()


def run(
    model: Any,
    tokenizer: Any,
    requests: list[GenerationRequest],
    *,
    blocks: int,
    slide: bool,
    rows: int,
) -> tuple[float, int, int, list[list[int]]]:
    """(tok/s, most blocks held at once, preemptions, each request's tokens)."""
    engine = Engine(
        model,
        tokenizer,
        EngineConfig(
            context_length=model.config.max_position_embeddings,
            max_batch_size=rows,
            block_size=BLOCK,
            max_num_blocks=blocks,
        ),
    )
    manager = engine._blocks
    if not slide:
        manager.window = None
    pool, peak, preempted = manager.pool, [0], [0]
    allocate, reset = pool.allocate, manager.reset

    def counted_allocate() -> int | None:
        block = allocate()
        peak[0] = max(peak[0], pool.held)
        return block

    def counted_reset(seq: Any) -> None:
        preempted[0] += 1
        reset(seq)

    pool.allocate = counted_allocate  # type: ignore[method-assign]
    manager.reset = counted_reset  # type: ignore[method-assign]
    start = time.perf_counter()
    results = sorted(engine.generate(requests), key=lambda r: int(r.id))
    elapsed = time.perf_counter() - start
    tokens = [r.choices[0].token_ids for r in results]
    return sum(map(len, tokens)) / elapsed, peak[0], preempted[0], tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=384)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--fit", type=int, default=16, help="rows the pool holds at full length")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(min(4, os.cpu_count() or 1))

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = load_model(str(build_demo_model(Path(tmp) / "tiny")))[1]
    length = args.prompt + args.tokens
    model = build_model(len(tokenizer), args.window, length)
    generator = torch.Generator().manual_seed(1)
    params = SamplingParams(max_new_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    requests = [
        GenerationRequest(
            str(i),
            torch.randint(3, len(tokenizer), (args.prompt,), generator=generator).tolist(),
            params,
        )
        for i in range(args.rows)
    ]
    blocks = args.fit * -(-length // BLOCK) + 1
    print(
        f"{args.rows} rows x ({args.prompt} prompt + {args.tokens} generated) tokens, "
        f"{args.window}-token window, pool of {blocks} blocks of {BLOCK} "
        f"({args.fit} rows at full length)"
    )
    # name -> (blocks given back, rows at once); "keep, fit rows" is what an operator would do
    # without it: as many rows as the pool holds at full length, so that none is preempted.
    strategies = {
        "give back": (True, args.rows),
        "keep": (False, args.rows),
        f"keep, {args.fit} rows": (False, args.fit),
    }
    rates: dict[str, list[float]] = {name: [] for name in strategies}
    outputs: dict[str, list[list[int]]] = {}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for name, (slide, rows) in strategies.items():
            rate, peak, preempted, tokens = run(
                model, tokenizer, requests, blocks=blocks, slide=slide, rows=rows
            )
            outputs[name] = tokens
            label = "warm-up" if round_ == 0 else f"round {round_}"
            print(
                f"  {label:8} {name:13}: {rate:7.1f} tok/s, at most {peak} blocks held, "
                f"{preempted} preemptions"
            )
            if round_:
                rates[name].append(rate)
    same = all(tokens == outputs["give back"] for tokens in outputs.values())
    medians = {name: statistics.median(r) for name, r in rates.items()}
    ours = medians.pop("give back")
    print(f"median: blocks given back {ours:.1f} tok/s")
    for name, rate in medians.items():
        print(f"        {name}: {rate:.1f} tok/s ({ours / rate:.2f}x)")
    print(f"same tokens: {'yes' if same else 'NO'}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
