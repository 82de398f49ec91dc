"""The engine in its own process against the engine alone (issue 6): what the pipe costs.

    .venv/bin/python benchmarks/engine_process.py [--model-size tiny|bench]
        [--requests 256] [--rounds 7]

The same requests as benchmarks/platform_vs_engine.py (mixed prompts and max_tokens, greedy,
prompts tokenized beforehand) through (a) an `Engine` in this process and (b) an
`EngineProcess` (the engine in a child process, as the worker runs it), fed from a list that
is always ready, so the difference is the child's own: the pipe, pickling, how it reads
requests and sends results. Alternating rounds after a warm-up of each; prints tok/s and the
median of each round's ratio. Runs on the embedded default (no services needed).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-size", default="tiny", choices=["tiny", "bench"])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    os.environ["BOARDWALK_DATA_DIR"] = tempfile.mkdtemp(prefix="boardwalk-engine-process-")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(name, None)

    import django

    django.setup()
    from django.core.management import call_command
    from platform_vs_engine import _bodies

    from inference.chat_completions import prompt_ids, sampling_params
    from inference.engine import Engine, EngineConfig, GenerationRequest
    from inference.engine.process import EngineProcess
    from inference.models import CatalogModel
    from inference.runtime import _load, _load_options, _load_tokenizer

    call_command("migrate", verbosity=0)
    with open(os.devnull, "w") as quiet:
        call_command("bootstrap_demo", "--json", "--model-size", args.model_size, stdout=quiet)
    revision = CatalogModel.objects.get(name="boardwalk/tiny-chat").revision
    model, tokenizer = _load(revision)
    config = EngineConfig(context_length=revision.context_length, max_batch_size=args.batch_size)
    here = Engine(model, tokenizer, config)
    child = EngineProcess(
        load=_load_options(revision), config=config, tokenizer=_load_tokenizer(revision)
    )
    requests = [
        GenerationRequest(str(i), prompt_ids(tokenizer, body), sampling_params(body))
        for i, body in enumerate(_bodies(args.requests, 1234))
    ]

    def run(engine: Any) -> float:
        began = time.perf_counter()
        tokens = sum(r.completion_tokens for r in engine.generate(iter(requests)))
        return tokens / (time.perf_counter() - began)

    try:
        run(here), run(child)
        alone, process = [], []
        for _ in range(args.rounds):
            alone.append(run(here))
            process.append(run(child))
    finally:
        child.close()
    print(f"model {args.model_size}, {args.requests} requests; {args.rounds} rounds")
    print(
        f"{'engine alone':<22} {statistics.median(alone):>7.0f} tok/s   runs: "
        + " ".join(f"{x:.0f}" for x in alone)
    )
    print(
        f"{'engine process':<22} {statistics.median(process):>7.0f} tok/s   runs: "
        + " ".join(f"{x:.0f}" for x in process)
    )
    ratio = statistics.median(p / a for p, a in zip(process, alone, strict=True))
    print(f"median of each round's ratio: engine process / engine alone {ratio:.3f}x")


if __name__ == "__main__":
    main()
