"""Generated tokens per second: our Engine against what a user would pick instead.

    .venv/bin/python benchmarks/engine.py [--requests 64 96 256] [--rounds 5] [--shared-prefix]

Mixed chat requests (prompts of 8 to 160 words, fixed RNG), every one with max_tokens 128,
whose real output lengths are hidden from every strategy: a hook on the model (none of the
strategies knows of it) forces the end-of-sequence token at positions drawn at random once
per run of the script, so each request ends at a random step below its max_tokens, which
depends on its prompt length only and is the same whichever strategy runs it. Strategies:

- (a) one `model.generate` call per request (on an evenly spread sample of the requests);
- (b) `model.generate` on padded static batches of 32, requests sorted by prompt length;
- (c) transformers' own continuous batching, `model.generate_batch` (paged cache), with its
      cache sized by hand to hold 32 requests at full length;
- (t) the same continuous batching tuned to the strongest configuration found (the baseline
      the engine's goal is measured against): 512 blocks of 32 tokens, a 512-token step
      budget, SDPA attention, 32 requests a step, requests streamed to its manager one by
      one and results taken as they finish;
- (d) `inference.engine.Engine`, 32 rows;
- (o) with `--old-engine DIR` (a copy of an older `inference/engine`, see below), that engine,
      32 rows, run beside the others: old against new in one run.

Each is warmed up, runs `--rounds` times (alternating, so that load from other processes falls
on all alike) and reports its median. tok/s counts each request's real output tokens.

`--shared-prefix` instead compares the engine with and without its prefix cache on requests
that all start with the same 500-token system prompt (the cache is emptied before each run).

`--model-size 1b` builds (once, on the spot, no download) a random-weight model of the shape
of Llama-3.2-1B, stored in bf16, for a GPU; the model runs on CUDA in bf16 when there is one.
After the medians, one more engine run is metered: tok/s, peak GPU memory, and the least bytes
its forwards had to read (weights once per forward + each sequence's live keys/values) per
second, as a fraction of the device's memory bandwidth (the roofline; `--bandwidth-gbs`, or
known GPUs by name).

`--host-rows 64 256 [--old-engine DIR]` measures the engine's host time instead: every row
decodes 64 tokens (max_batch_size = rows), and the wall time outside the model's forwards is
divided by the forwards; "steady decoding" is the host time before each forward in which
every row decodes (since the forward before it), per such forward (the goal: at most 0.5 ms
per forward at 256 decoding rows). With
`--old-engine` (a copy of an older `inference/engine`, e.g. `git archive REV inference/engine |
tar -x -C /tmp/old`, then `/tmp/old/inference/engine`) that engine runs too, alternating, in
the same process. With `--shared-prefix` the rows share the 500-token system prompt (packed
steps read its blocks once for all rows; decoding still goes padded where that is cheaper).

`--json PATH` also writes each request count's figures (median tok/s of every strategy and the
metered run's) to PATH as JSON, rewritten after each count (benchmarks/gpu_check.py reads it).

`--structured [options of benchmarks/structured.py]` runs that script: the same batch with and
without JSON schemas on half of its rows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from inference.demo.model import _CORPUS, build_demo_model  # noqa: E402
from inference.engine import (  # noqa: E402
    Engine,
    EngineConfig,
    GenerationRequest,
    SamplingParams,
    load_model,
)
from inference.rendering import render_prompt  # noqa: E402

WIDTH = 32  # rows of the engine, static batch size, requests the generate_batch cache holds
MAX_TOKENS = 128
END_RATE = 1 / 48  # chance that a given position is forced to end the sequence


class HiddenEnds:
    """Forces end-of-sequence at fixed random positions, inside the model's forward."""

    def __init__(self, model: Any, eos: int, *, seed: int, positions: int = 4096) -> None:
        rng = torch.Generator().manual_seed(seed)
        self.ends = torch.rand(positions, generator=rng) < END_RATE
        self.eos = eos
        self._positions: torch.Tensor | None = None
        model.register_forward_pre_hook(self._before, with_kwargs=True)
        model.register_forward_hook(self._after)

    def length(self, prompt_tokens: int) -> int:
        """Real output length of a request: through the first forced end, at most MAX_TOKENS."""
        hits = self.ends[prompt_tokens : prompt_tokens + MAX_TOKENS].nonzero()
        return int(hits[0]) + 1 if len(hits) else MAX_TOKENS

    def _before(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        positions = kwargs.get("position_ids")
        if positions is None:  # the engine's one-token probe of the K/V shape, no generation
            self._positions = None
            return
        keep = kwargs.get("logits_to_keep", 0)
        if isinstance(keep, torch.Tensor):
            positions = positions[:, keep.to(positions.device).long()]
        elif keep:
            positions = positions[:, -keep:]
        self._positions = positions

    def _after(self, module: Any, args: Any, output: Any) -> None:
        if self._positions is None:
            return
        logits = output.logits
        assert self._positions.shape == logits.shape[:2]
        # The logits at position p choose the token at p + 1.
        hit = self.ends.to(logits.device)[(self._positions + 1).clamp(max=len(self.ends) - 1)]
        forced = logits[hit]
        forced[:] = float("-inf")
        forced[:, self.eos] = 0.0
        logits[hit] = forced


# Peak memory bandwidth of common accelerators, bytes/s (vendor figures); --bandwidth-gbs wins.
_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.04e12, "L40S": 0.864e12, "L4": 0.3e12}


class DecodeTraffic:
    """The least memory traffic of the model's forwards: its weights once per forward, and
    each sequence's live keys/values once (packed prompt pieces and decoding rows alike).

    Sequences are told apart by their positions: a row's positions run on by one within a
    sequence, so a sequence ends where the next position is not its position + 1. The sums stay
    on the device (no synchronisation per step) until `total_bytes` is read.
    """

    def __init__(self, model: Any) -> None:
        config = model.config
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        self.weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self.kv_bytes_per_token = (
            2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
        ) * model.dtype.itemsize
        self.enabled = False
        self.forwards = 0
        self._tokens: list[torch.Tensor] = []
        model.register_forward_pre_hook(self._count, with_kwargs=True)

    def reset(self) -> None:
        self.forwards, self._tokens = 0, []

    def total_bytes(self) -> int:
        live = int(sum(t.item() for t in self._tokens))
        return self.forwards * self.weight_bytes + live * self.kv_bytes_per_token

    def _count(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if not self.enabled:
            return
        positions = kwargs["position_ids"]
        ends = torch.ones_like(positions, dtype=torch.bool)
        ends[..., :-1] = positions[..., 1:] != positions[..., :-1] + 1
        self.forwards += 1
        self._tokens.append(((positions + 1) * ends).sum())


def device_bandwidth(device: torch.device, given_gbs: float | None) -> float | None:
    if given_gbs:
        return given_gbs * 1e9
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((bw for key, bw in _BANDWIDTH.items() if key in name), None)


def roofline_run(
    engine: Engine,
    requests: list[GenerationRequest],
    traffic: DecodeTraffic,
    tokens: int,
    bandwidth: float | None,
    device: torch.device,
) -> dict[str, float | None]:
    """One more engine run, metered: tok/s, peak device memory, fraction of the roofline;
    printed, and returned (GiB and the fraction are None where not known)."""
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    traffic.reset()
    traffic.enabled = True
    began = time.perf_counter()
    with torch.inference_mode():
        run_engine(engine, requests)
    if on_gpu:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - began
    traffic.enabled = False
    moved = traffic.total_bytes()
    figures: dict[str, float | None] = {
        "tok_s": tokens / seconds,
        "forwards": traffic.forwards,
        "gb_read": moved / 1e9,
        "peak_gib": None,
        "total_gib": None,
        "roofline": None,
    }
    line = (
        f"  metered engine run: {tokens / seconds:7.1f} tok/s, {traffic.forwards} forwards, "
        f"{moved / 1e9:.1f} GB read at least ({moved / seconds / 1e9:.0f} GB/s)"
    )
    if on_gpu:
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        figures.update(peak_gib=peak, total_gib=total)
        line += f"; GPU memory peak {peak:.1f} of {total:.0f} GiB"
    if bandwidth:
        figures["roofline"] = moved / seconds / bandwidth
        line += f"; {moved / seconds / bandwidth:.1%} of the {bandwidth / 1e12:.2f} TB/s roofline"
    print(line, flush=True)
    return figures


def make_requests(
    tokenizer: Any, count: int, seed: int, system: str = "You are a helpful assistant."
) -> list[GenerationRequest]:
    rng = random.Random(seed)
    words = _CORPUS.split()
    requests = []
    for i in range(count):
        start = rng.randrange(len(words))
        length = rng.choice([8, 20, 40, 80, 160])
        text = " ".join(words[(start + j) % len(words)] for j in range(length))
        messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        params = SamplingParams(max_new_tokens=MAX_TOKENS, temperature=0.0)
        requests.append(GenerationRequest(str(i), render_prompt(tokenizer, messages), params))
    return requests


def long_system(tokenizer: Any) -> str:
    """A system prompt of about 500 tokens."""
    system = " ".join(_CORPUS.split()[:1000])
    while len(tokenizer(system)["input_ids"]) > 500:
        system = system.rsplit(" ", 1)[0]
    return system


def _until_eos(tokens: list[int], eos: int) -> int:
    return tokens.index(eos) + 1 if eos in tokens else len(tokens)


def run_single(model: Any, requests: list[GenerationRequest], eos: int) -> list[int]:
    lengths = []
    for r in requests:
        out = model.generate(
            torch.tensor([r.prompt_ids]),
            attention_mask=torch.ones(1, len(r.prompt_ids), dtype=torch.long),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos,
        )
        lengths.append(_until_eos(out[0, len(r.prompt_ids) :].tolist(), eos))
    return lengths


def run_static(model: Any, requests: list[GenerationRequest], eos: int, pad: int) -> list[int]:
    """Padded batches of WIDTH, sorted by prompt length; each runs until its last row ends."""
    order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
    lengths = [0] * len(requests)
    for lo in range(0, len(order), WIDTH):
        batch = order[lo : lo + WIDTH]
        width = max(len(requests[i].prompt_ids) for i in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            p = requests[i].prompt_ids
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad,
        )
        for row, i in enumerate(batch):
            lengths[i] = _until_eos(out[row, width:].tolist(), eos)
    return lengths


def run_generate_batch(
    model: Any, requests: list[GenerationRequest], eos: int, pad: int
) -> list[int]:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    longest = max(len(r.prompt_ids) for r in requests) + MAX_TOKENS
    page = 64
    cb = ContinuousBatchingConfig(
        page_size=page,
        num_blocks=WIDTH * -(-longest // page),  # WIDTH requests at full length
        max_batch_tokens=512,  # the engine's step budget on CPU
        max_requests_per_batch=WIDTH,
        allow_block_sharing=False,
    )
    config = GenerationConfig(
        max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=pad
    )
    out = model.generate_batch(
        inputs=[r.prompt_ids for r in requests],
        generation_config=config,
        continuous_batching_config=cb,
        warmup=False,
    )
    by_index = {int(key.rsplit("_", 1)[-1]): value for key, value in out.items()}
    return [_until_eos(list(by_index[i].generated_tokens), eos) for i in range(len(requests))]


def run_cb_tuned(model: Any, requests: list[GenerationRequest], eos: int, pad: int) -> list[int]:
    """transformers' continuous batching at its strongest found here: a hand-sized paged
    cache of 512 blocks of 32 tokens, a 512-token step budget, SDPA attention (the model's
    own), at most WIDTH requests a step, and requests streamed to the manager one by one as
    a server would (`add_request`), results taken as they finish."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    cb = ContinuousBatchingConfig(
        page_size=32,
        num_blocks=512,
        max_batch_tokens=512,
        max_requests_per_batch=WIDTH,
        allow_block_sharing=False,
    )
    config = GenerationConfig(
        max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=pad
    )
    manager = model.init_continuous_batching(
        generation_config=config, continuous_batching_config=cb
    )
    manager.start()
    lengths = [0] * len(requests)
    try:
        for i, request in enumerate(requests):
            manager.add_request(request.prompt_ids, request_id=str(i), max_new_tokens=MAX_TOKENS)
        for _ in requests:
            out = manager.get_result(timeout=600)
            if out is None or out.error:
                raise RuntimeError(f"continuous batching gave no result: {out and out.error}")
            lengths[int(out.request_id)] = _until_eos(list(out.generated_tokens), eos)
    finally:
        manager.stop(block=True)
    return lengths


def run_engine(engine: Engine, requests: list[GenerationRequest]) -> list[int]:
    lengths = [0] * len(requests)
    for result in engine.generate(iter(requests)):
        assert result.error is None, result.error
        lengths[int(result.id)] = result.completion_tokens
    return lengths


def measure(
    runs: dict[str, Callable[[], list[int]]],
    expected: dict[str, list[int]],
    rounds: int,
) -> dict[str, float]:
    """Median tok/s of each run over `rounds` alternating rounds, after one warm-up each."""
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(rounds + 1):
        for name, run in runs.items():
            began = time.perf_counter()
            with torch.inference_mode():
                lengths = run()
            seconds = time.perf_counter() - began
            wrong = sum(a != b for a, b in zip(lengths, expected[name], strict=True))
            tokens = sum(expected[name])
            tag = "warm-up" if round_ == 0 else f"round {round_}"
            print(
                f"  {tag:8} {name:44} {tokens:6d} tok {seconds:7.1f} s "
                f"{tokens / seconds:7.1f} tok/s" + (f"  ({wrong} lengths differ)" if wrong else ""),
                flush=True,
            )
            if round_:
                rates[name].append(tokens / seconds)
    return {name: statistics.median(found) for name, found in rates.items()}


class ForwardClock:
    """Wall time spent inside the model's forwards, and how many there were; with `rows`,
    also the host time before each forward of `rows` one-token rows (steady decoding: every
    row decodes), counted from the end of the forward before it."""

    def __init__(self, model: Any) -> None:
        self.seconds, self.forwards, self._began = 0.0, 0, 0.0
        self.rows = 0
        self.decoding_host, self.decoding_forwards = 0.0, 0
        self._ended: float | None = None
        model.register_forward_pre_hook(self._before, with_kwargs=True)
        model.register_forward_hook(self._after)

    def reset(self, rows: int) -> None:
        self.seconds, self.forwards, self.rows = 0.0, 0, rows
        self.decoding_host, self.decoding_forwards, self._ended = 0.0, 0, None

    def _before(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        self._began = time.perf_counter()
        ids = kwargs.get("input_ids")
        shape = tuple(ids.shape) if ids is not None else ()
        if self._ended is not None and shape in ((self.rows, 1), (1, self.rows)):
            self.decoding_host += self._began - self._ended
            self.decoding_forwards += 1

    def _after(self, module: Any, args: Any, output: Any) -> None:
        self._ended = time.perf_counter()
        self.seconds += self._ended - self._began
        self.forwards += 1


def build_engine(model: Any, tokenizer: Any, **options: Any) -> Engine:
    """This tree's `Engine`, with `options` for its `EngineConfig`."""
    return Engine(model, tokenizer, EngineConfig(**options))


def load_engine_builder(directory: Path) -> Callable[..., Any]:
    """What builds an `Engine` from a copy of the engine package elsewhere, imported under its
    own name, called as `build_engine`: a copy from before config.py takes the options as
    keyword arguments."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "old_engine", directory / "__init__.py", submodule_search_locations=[str(directory)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_engine"] = module
    spec.loader.exec_module(module)
    engine_class = importlib.import_module("old_engine.engine").Engine
    if not (directory / "config.py").exists():
        return engine_class
    config_class = importlib.import_module("old_engine.config").EngineConfig

    def build(model: Any, tokenizer: Any, **options: Any) -> Any:
        return engine_class(model, tokenizer, config_class(**options))

    return build


def host_time(model: Any, tokenizer: Any, args: argparse.Namespace) -> None:
    """Host milliseconds per forward outside the model, decoding `rows` rows at once."""
    clock = ForwardClock(model)
    engines: dict[str, Callable[..., Any]] = {"new": build_engine}
    if args.old_engine:
        engines = {"old": load_engine_builder(args.old_engine), **engines}
    tokens = 64
    system = long_system(tokenizer) if args.shared_prefix else "You are a helpful assistant."
    for rows in args.host_rows:
        requests = make_requests(tokenizer, rows, args.seed, system=system)
        for r in requests:
            r.params = SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
        built = {
            name: build(model, tokenizer, context_length=2048, max_batch_size=rows)
            for name, build in engines.items()
        }
        found: dict[str, list[float]] = {name: [] for name in built}
        steady: dict[str, list[float]] = {name: [] for name in built}
        for round_ in range(args.rounds + 1):
            for name, engine in built.items():
                clock.reset(rows)
                began = time.perf_counter()
                with torch.inference_mode():
                    for _ in engine.generate(iter(requests)):
                        pass
                wall = time.perf_counter() - began
                host = (wall - clock.seconds) / clock.forwards * 1e3
                decoding = clock.decoding_host / max(clock.decoding_forwards, 1) * 1e3
                tag = "warm-up" if round_ == 0 else f"round {round_}"
                print(
                    f"  {tag:8} {name} engine, {rows} rows: {clock.forwards} forwards, "
                    f"{wall:.2f} s, {clock.seconds / wall:.0%} in forwards, "
                    f"host {host:.2f} ms/forward, steady decoding {decoding:.2f} ms/forward "
                    f"({clock.decoding_forwards} forwards), {rows * tokens / wall:.0f} tok/s",
                    flush=True,
                )
                if round_:
                    found[name].append(host)
                    steady[name].append(decoding)
        for name, hosts in found.items():
            # The least is printed too: load from other processes only ever adds to it.
            median, least = statistics.median(hosts), min(hosts)
            print(
                f"  median {name} engine, {rows} rows: host {median:.2f} ms/forward "
                f"(least {least:.2f}); steady decoding {statistics.median(steady[name]):.2f} "
                f"(least {min(steady[name]):.2f})"
            )


def main() -> None:
    if "--structured" in sys.argv:
        import runpy

        sys.argv = [str(ROOT / "benchmarks/structured.py")] + [
            a for a in sys.argv[1:] if a != "--structured"
        ]
        runpy.run_path(sys.argv[0], run_name="__main__")
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=ROOT / "var/models/tiny-chat-bench")
    parser.add_argument("--requests", type=int, nargs="+", default=[64, 96, 256])
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--rounds", type=int, default=5, help="median of this many runs each")
    parser.add_argument("--single-sample", type=int, default=16, help="requests run by (a)")
    parser.add_argument("--shared-prefix", action="store_true")
    parser.add_argument("--skip", nargs="*", default=[], help="strategy letters to leave out")
    parser.add_argument(
        "--model-size",
        choices=["tiny", "bench", "1b"],
        default="bench",
        help="demo model built on the spot (1b: the shape of Llama-3.2-1B, for a GPU)",
    )
    parser.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when available)")
    parser.add_argument(
        "--bandwidth-gbs",
        type=float,
        help="the device's memory bandwidth for the roofline (default: known GPUs by name)",
    )
    parser.add_argument("--host-rows", type=int, nargs="*", help="measure host time (see doc)")
    parser.add_argument(
        "--old-engine", type=Path, help="an older engine package: run beside the engine as (o)"
    )
    parser.add_argument("--json", type=Path, help="also write each request count's figures here")
    args = parser.parse_args()

    model_dir = args.model_dir
    if args.model_size != "bench" and model_dir == parser.get_default("model_dir"):
        model_dir = ROOT / f"var/models/tiny-chat-{args.model_size}"
    model_dir = build_demo_model(model_dir, size=args.model_size)
    model, tokenizer = load_model(str(model_dir), device=args.device)
    if args.host_rows:  # no hidden ends: every row decodes as long as the others
        host_time(model, tokenizer, args)
        return
    eos = int(tokenizer.eos_token_id)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    hidden = HiddenEnds(model, eos, seed=args.seed)
    traffic = DecodeTraffic(model)
    bandwidth = device_bandwidth(model.device, args.bandwidth_gbs)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model {model_dir.name}: {params / 1e6:.1f}M params, {model.dtype}, {model.device}, "
        f"torch threads {torch.get_num_threads()}; max_tokens {MAX_TOKENS}, width {WIDTH}",
        flush=True,
    )

    if args.shared_prefix:
        system = long_system(tokenizer)
        for count in args.requests:
            requests = make_requests(tokenizer, count, args.seed, system=system)
            expected = [hidden.length(len(r.prompt_ids)) for r in requests]
            cached = Engine(
                model, tokenizer, EngineConfig(context_length=2048, max_batch_size=WIDTH)
            )
            plain = Engine(
                model,
                tokenizer,
                EngineConfig(context_length=2048, max_batch_size=WIDTH, prefix_cache=False),
            )

            def with_cache(engine: Engine = cached, requests: list = requests) -> list[int]:
                engine.clear_prefix_cache()  # every run computes the system prompt once
                return run_engine(engine, requests)

            runs = {
                "engine, prefix cache off": lambda e=plain, r=requests: run_engine(e, r),
                "engine, prefix cache on": with_cache,
            }
            prompt_tokens = sum(len(r.prompt_ids) for r in requests)
            print(
                f"{count} requests sharing a {len(tokenizer(system)['input_ids'])}-token system "
                f"prompt; {prompt_tokens} prompt tokens, {sum(expected)} to generate",
                flush=True,
            )
            rates = measure(runs, dict.fromkeys(runs, expected), args.rounds)
            for name, rate in rates.items():
                print(f"  median {name:44} {rate:7.1f} tok/s")
            on, off = rates["engine, prefix cache on"], rates["engine, prefix cache off"]
            print(f"  prefix cache on / off: {on / off:.2f}x", flush=True)
        return

    summary: list[dict[str, Any]] = []
    build_old = load_engine_builder(args.old_engine) if args.old_engine else None
    for count in args.requests:
        requests = make_requests(tokenizer, count, args.seed)
        expected = [hidden.length(len(r.prompt_ids)) for r in requests]
        sample = requests[:: max(1, len(requests) // args.single_sample)]
        sample_expected = [hidden.length(len(r.prompt_ids)) for r in sample]
        engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=WIDTH))
        prompt_lengths = sorted(len(r.prompt_ids) for r in requests)
        print(
            f"{count} requests, prompt tokens {prompt_lengths[0]}..{prompt_lengths[-1]}, "
            f"{sum(expected)} tokens to generate (mean {sum(expected) / count:.1f} each)",
            flush=True,
        )
        runs: dict[str, Callable[[], list[int]]] = {
            f"(a) model.generate one at a time ({len(sample)} req)": lambda s=sample: run_single(
                model, s, eos
            ),
            f"(b) model.generate sorted static batches of {WIDTH}": lambda r=requests: run_static(
                model, r, eos, pad
            ),
            "(c) transformers generate_batch (paged)": lambda r=requests: run_generate_batch(
                model, r, eos, pad
            ),
            "(t) transformers continuous batching, tuned": lambda r=requests: run_cb_tuned(
                model, r, eos, pad
            ),
            f"(d) engine, {WIDTH} rows": lambda r=requests, e=engine: run_engine(e, r),
        }
        if build_old is not None:  # the same engine before a change, side by side
            old = build_old(model, tokenizer, context_length=2048, max_batch_size=WIDTH)
            runs[f"(o) the old engine, {WIDTH} rows"] = lambda r=requests, e=old: run_engine(e, r)
        runs = {name: run for name, run in runs.items() if name[1] not in args.skip}
        wanted = {name: sample_expected if name.startswith("(a)") else expected for name in runs}
        rates = measure(runs, wanted, args.rounds)
        for name, rate in rates.items():
            print(f"  median {name:44} {rate:7.1f} tok/s")
        ours = rates[next(n for n in rates if n.startswith("(d)"))]
        for name, rate in rates.items():
            if not name.startswith("(d)"):
                print(f"  engine / {name[:3]}: {ours / rate:.2f}x")
        metered = roofline_run(engine, requests, traffic, sum(expected), bandwidth, model.device)
        print(flush=True)
        if args.json:
            run = {"requests": count, "model": model_dir.name, "device": str(model.device)}
            summary.append({**run, "tok_s": rates, "metered": metered})
            args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
