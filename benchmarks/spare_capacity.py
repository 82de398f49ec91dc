"""Batch on spare capacity: interactive requests beside a batch backlog on one engine.

    .venv/bin/python benchmarks/spare_capacity.py [--seconds 30] [--load 0.3]
        [--old-engine DIR] [--rounds 1] [--json PATH]

Drives the in-process `Engine` directly on the bench model (built once under var/models, no
download), 32 rows, as a worker would: interactive requests (priority 1, streamed, 32 tokens,
greedy) arrive at a fixed Poisson rate and are added as they come (the engine's scheduler puts
them ahead of batch rows, and a decoding run gives way to them); the batch
backlog is 2,000 rows (prompts of 8 to 160 words, 16 to 128 tokens each, from a fixed RNG).
Each phase runs for `--seconds`:

- batch alone (new engine, and the old one when given): batch tokens per second;
- (a) interactive alone and (b) interactive while the backlog runs: p50/p99 time to first token
  (from each request's arrival to its first partial text), and batch tokens per second in (b).

The interactive rate is set from the batch-alone throughput: `--load` of it (0.3: interactive
requests ask for 30 % of the tokens the engine makes on batch alone). Batch tokens count the
rows that finished inside the window (the same cut in every phase). The old engine is a copy of
an older `inference/engine` (`--old-engine DIR`: `git archive REV inference/engine | tar -x -C
/tmp/old`, then /tmp/old/inference/engine), run in the same process. On a shared CPU the
figures move with the other processes' load: the phases run alternately over `--rounds`, and
medians are printed. `--json PATH` also writes those medians to PATH as JSON
(benchmarks/gpu_check.py reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.engine import build_engine, load_engine_builder, make_requests  # noqa: E402
from inference.demo.model import build_demo_model  # noqa: E402
from inference.engine import GenerationRequest, load_model  # noqa: E402
from inference.engine.types import PartialResult, SamplingParams  # noqa: E402

ROWS = 32
BACKLOG = 2000
CHAT_TOKENS = 32


def backlog(tokenizer: Any, seed: int) -> list[GenerationRequest]:
    rng = random.Random(seed)
    rows = make_requests(tokenizer, BACKLOG, seed)
    return [
        replace(
            r,
            id=f"b{r.id}",
            params=SamplingParams(
                max_new_tokens=rng.randint(16, 128), temperature=0.0, ignore_eos=True
            ),
        )
        for r in rows
    ]


def chats(tokenizer: Any, rate: float, seconds: float, seed: int) -> list[tuple[float, Any]]:
    """(arrival second, request): Poisson arrivals at `rate` per second."""
    rng = random.Random(seed)
    prompts = make_requests(tokenizer, 256, seed + 1)
    arrivals, at = [], rng.expovariate(rate)
    while at < seconds:
        request = prompts[len(arrivals) % len(prompts)]
        params = SamplingParams(max_new_tokens=CHAT_TOKENS, temperature=0.0, ignore_eos=True)
        arrivals.append(
            (at, replace(request, id=f"i{len(arrivals)}", params=params, priority=1, stream=True))
        )
        at += rng.expovariate(rate)
    return arrivals


@dataclass
class Phase:
    ttft: list[float] = field(default_factory=list)
    batch_tokens: int = 0
    seconds: float = 0.0
    unanswered: int = 0  # interactive requests with no first token when the run ended

    @property
    def batch_tok_s(self) -> float:
        return self.batch_tokens / self.seconds if self.seconds else 0.0


def run_phase(
    engine: Any,
    batch: list[GenerationRequest],
    arrivals: list[tuple[float, Any]],
    seconds: float,
    *,
    pulled: bool = False,
) -> Phase:
    """Batch rows from `batch` for `seconds`, and every arrival in `arrivals` (waited for
    after the window), driven as the worker's run drives the engine: batch rows added while
    rows are free, each interactive request added when it arrives (a decoding run gives way
    to it: the step's `interrupt`). What is held when both are done is dropped. `pulled`: an
    older engine package (`--old-engine`), batch alone through its `generate`."""
    if pulled:
        return _pulled_phase(engine, batch, seconds)
    phase = Phase()
    pending = list(arrivals)
    rows = iter(batch)
    began = time.perf_counter()
    arrived: dict[str, float] = {}
    first: dict[str, float] = {}

    def due() -> bool:
        return bool(pending) and began + pending[0][0] <= time.perf_counter()

    try:
        while True:
            while due():
                at, request = pending.pop(0)
                arrived[request.id] = began + at
                engine.add(request)
            while time.perf_counter() - began < seconds and engine.rows_in_use < ROWS:
                request = next(rows, None)
                if request is None:
                    break
                engine.add(request)
            if not engine.has_unfinished:
                if not pending:
                    break
                time.sleep(max(0.0, began + pending[0][0] - time.perf_counter()))
                continue
            for item in engine.step(interrupt=due):
                now = time.perf_counter()
                if isinstance(item, PartialResult):
                    first.setdefault(item.id, now)
                    continue
                assert item.error is None, item
                if item.id.startswith("i"):
                    first.setdefault(item.id, now)
                elif now - began <= seconds:
                    phase.batch_tokens += item.completion_tokens
            over = time.perf_counter() - began >= seconds
            if over and not pending and set(first) >= set(arrived):
                break
    finally:
        engine.reset()
    phase.seconds = seconds
    phase.ttft = [first[i] - arrived[i] for i in arrived if i in first]
    phase.unanswered = len(arrived) - len(phase.ttft)
    return phase


def _pulled_phase(engine: Any, batch: list[GenerationRequest], seconds: float) -> Phase:
    """Batch alone on an engine that pulls from a source (`generate`)."""
    phase = Phase()
    began = time.perf_counter()

    def source() -> Iterator[GenerationRequest]:
        for request in batch:
            if time.perf_counter() - began >= seconds:
                return
            yield request

    stream = engine.generate(source())
    try:
        for item in stream:
            now = time.perf_counter()
            if now - began > seconds:
                break
            # (the old engine's results are its own package's class)
            if not hasattr(item, "completion_tokens"):
                continue
            assert item.error is None, item
            phase.batch_tokens += item.completion_tokens
    finally:
        stream.close()
    phase.seconds = seconds
    return phase


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def round_line(alone: dict[str, list[float]], chats: int, rate: float, a: Phase, b: Phase) -> str:
    def ms(values: list[float], q: float) -> str:
        return f"{pct(values, q) * 1e3:.0f} ms"

    line = "batch alone " + ", ".join(f"{k} {v[-1]:.0f} tok/s" for k, v in alone.items())
    line += f"; {chats} chats at {rate:.2f}/s: TTFT p50 (a) {ms(a.ttft, 0.5)} (b) {ms(b.ttft, 0.5)}"
    line += f", p99 (a) {ms(a.ttft, 0.99)} (b) {ms(b.ttft, 0.99)}"
    line += f"; batch in (b) {b.batch_tok_s:.0f} tok/s"
    if a.unanswered or b.unanswered:
        line += f"; unanswered {a.unanswered} + {b.unanswered}"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="each phase's window")
    parser.add_argument("--load", type=float, default=0.3, help="interactive share of capacity")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--old-engine", type=Path, help="an older engine package directory")
    parser.add_argument("--model-dir", type=Path, default=ROOT / "var/models/tiny-chat-bench")
    parser.add_argument("--device", default=None)
    parser.add_argument("--seed", type=int, default=7)
    # On a CPU shared with other processes one thread is several times faster than a pool
    # whose threads wait on each other (8 against 64 tok/s at one row on 2 loaded cores).
    parser.add_argument("--threads", type=int, default=1, help="torch threads on a CPU")
    parser.add_argument("--json", type=Path, help="also write the medians here")
    args = parser.parse_args()

    model_dir = build_demo_model(args.model_dir, size="bench")
    model, tokenizer = load_model(str(model_dir), device=args.device)
    if model.device.type == "cpu":
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rows = backlog(tokenizer, args.seed)
    engines: dict[str, Callable[..., Any]] = {"new": build_engine}
    if args.old_engine:
        engines["old"] = load_engine_builder(args.old_engine)

    def build(kind: str) -> Any:
        return engines[kind](model, tokenizer, context_length=2048, max_batch_size=ROWS)

    print(
        f"model {model_dir.name} on {model.device}, {ROWS} rows, backlog {BACKLOG} rows, "
        f"windows of {args.seconds:.0f} s, {args.rounds} round(s), "
        f"{os.cpu_count()} CPU(s) (shared with other processes: figures move with them)"
    )
    run_phase(build("new"), rows[:64], [], 5.0)  # warm-up
    alone: dict[str, list[float]] = {k: [] for k in engines}
    a_ttft: list[float] = []
    b_ttft: list[float] = []
    b_batch: list[float] = []
    rates: list[float] = []
    for r in range(args.rounds):
        for kind in engines:
            phase = run_phase(build(kind), rows, [], args.seconds, pulled=kind == "old")
            alone[kind].append(phase.batch_tok_s)
        rate = max(args.load * alone["new"][-1] / CHAT_TOKENS, 1 / args.seconds)
        rates.append(rate)
        arrivals = chats(tokenizer, rate, args.seconds, args.seed + r)
        a = run_phase(build("new"), [], arrivals, args.seconds)
        b = run_phase(build("new"), rows, arrivals, args.seconds)
        a_ttft.extend(a.ttft)
        b_ttft.extend(b.ttft)
        b_batch.append(b.batch_tok_s)
        print(f"round {r + 1}: " + round_line(alone, len(arrivals), rate, a, b))

    new_alone = statistics.median(alone["new"])
    print()
    print(
        f"interactive: {statistics.median(rates):.2f} requests/s of {CHAT_TOKENS} tokens "
        f"({args.load:.0%} of batch-alone tokens), {len(a_ttft)} in (a), {len(b_ttft)} in (b)"
    )
    summary: dict[str, Any] = {"model": model_dir.name, "device": str(model.device)}
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        a_q, b_q = pct(a_ttft, q), pct(b_ttft, q)
        summary[f"ttft_{name}_ms"] = {"alone": a_q * 1e3, "beside_batch": b_q * 1e3}
        print(
            f"TTFT {name}: (a) alone {a_q * 1e3:.0f} ms, (b) beside batch {b_q * 1e3:.0f} ms, "
            f"(b)/(a) {b_q / a_q:.2f}"
        )
    if "old" in alone:
        old = statistics.median(alone["old"])
        print(
            f"batch alone: new {new_alone:.0f} tok/s, old {old:.0f} tok/s, "
            f"new/old {new_alone / old:.3f}"
        )
    else:
        print(f"batch alone: new {new_alone:.0f} tok/s (no old engine given)")
    during = statistics.median(b_batch)
    share = f"{during / new_alone:.0%} of batch alone" if new_alone else "no batch row ended alone"
    print(f"batch during (b): {during:.0f} tok/s, {share}")
    if args.json:
        summary.update(batch_alone_tok_s=new_alone, batch_during_tok_s=during)
        summary.update(chats=[len(a_ttft), len(b_ttft)], requests_per_s=statistics.median(rates))
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
