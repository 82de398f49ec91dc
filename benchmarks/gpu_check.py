"""One command for the day a device is lent: the GPU tests and the GPU figures, in one table.

    .venv/bin/python benchmarks/gpu_check.py [--quick] [--budget 450] [--logs DIR] [--cpu]

Parts, each a subprocess with its own timeout, run in this order:

1. tests: pytest (`-p no:cacheprovider`) on the tests that need a GPU to run at all:
   tests/inference/test_engine_graphs.py (CUDA graphs; its GPU test skips without one), and
   tests/inference/test_tensor_parallel.py when there are at least 2 GPUs (its ranks run on the
   CPU with gloo today, so this reruns what the CPU suite checks, on the GPU machine).
   Counts of passed, failed and skipped tests; a failure makes the exit status 1.
2. engine: benchmarks/engine.py `--model-size 1b` (the shape of Llama-3.2-1B, random weights,
   bf16) at 64 and 256 requests on 32 engine rows: the engine over the best of
   `model.generate` one at a time, sorted static batches and `generate_batch`, and the metered
   engine run's tok/s, peak GPU memory and fraction of the memory-bandwidth roofline.
3. spare capacity: benchmarks/spare_capacity.py (bench model): interactive time to first token
   beside a batch backlog over alone, and batch tokens beside interactive over batch alone.

Then ONE table: check, figure, goal (as docs/PERFORMANCE.md writes it, with its section),
verdict. Goals missed do not change the exit status; a test that fails, or a benchmark that
crashes, does (1). A part that runs past its timeout is stopped, and reported with what it had
printed. The whole run stays within `--budget` seconds (default 450, under 8 minutes with the
start): each part's timeout is cut to what is left, and once too little is left the remaining
parts are skipped, each with a line saying so. What the device lacks (CUDA, a second GPU,
free memory, an optional package) is said in one line each and skips what needs it; with no
CUDA at all the script prints what it would run and exits 0 at once.

`--quick` shrinks every part (a dry run of the plumbing: its figures are not to be recorded).
`--cpu` runs the parts on the CPU anyway, with the tiny model for the engine part: a try of
the script itself where no device is lent; its figures mean nothing. Each part's full output
is kept in `--logs` (default var/gpu-check/), one file a part.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

# ruff: noqa: S603 (it starts this repository's own scripts and pytest, with this interpreter)

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

BUDGET_S = 450.0
MIN_PART_S = 30.0  # a part given less than this is skipped rather than started
ENGINE_MEMORY_GIB = 8.0  # 1b weights (~2 GiB), its K/V pool and the transformers baselines
SPARE_MEMORY_GIB = 2.0

# Goals, as docs/PERFORMANCE.md writes them (section in quotes).
ENGINE_SECTION = 'docs/PERFORMANCE.md "Engine"'
HOST_SECTION = 'docs/PERFORMANCE.md "Host work per forward, and real model families"'
SPARE_SECTION = 'docs/PERFORMANCE.md "Interactive traffic beside batch"'


# -- the table: pure functions ------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    at_least: bool  # True: the figure must be >= value; False: <= value
    value: float
    source: str = ""


@dataclass(frozen=True)
class Row:
    check: str
    figure: float | None  # None: the part gave no figure (skipped, timed out, crashed)
    unit: str = ""  # "x", "%" (figure a fraction), " tok/s", " GiB", " failed"
    goal: Goal | None = None
    shown: str | None = None  # how the figure is written where the number alone says too little


def format_value(value: float, unit: str) -> str:
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value * 100:.1f} %"
    if unit == " tok/s":
        return f"{value:,.0f} tok/s"
    if unit == " GiB":
        return f"{value:.1f} GiB"
    return f"{value:g}{unit}"


def verdict(figure: float | None, goal: Goal | None) -> str:
    """met / missed against the goal; "no figure" where the part gave none; "-" without a goal."""
    if figure is None or math.isnan(figure):
        return "no figure"
    if goal is None:
        return "-"
    ok = figure >= goal.value if goal.at_least else figure <= goal.value
    return "met" if ok else "missed"


def goal_text(goal: Goal | None, unit: str) -> str:
    if goal is None:
        return "-"
    text = f"{'at least' if goal.at_least else 'at most'} {format_value(goal.value, unit)}"
    return f"{text} ({goal.source})" if goal.source else text


def render_table(rows: list[Row]) -> str:
    """A Markdown table: check, figure, goal, verdict (columns padded to line up)."""
    cells = [("check", "figure", "goal", "verdict")]
    for row in rows:
        if row.figure is None or math.isnan(row.figure):
            figure = row.shown or "-"
        else:
            figure = row.shown or format_value(row.figure, row.unit)
        cells.append(
            (row.check, figure, goal_text(row.goal, row.unit), verdict(row.figure, row.goal))
        )
    widths = [max(len(line[i]) for line in cells) for i in range(4)]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |"
        for line in cells
    ]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)


def pytest_counts(output: str) -> dict[str, int]:
    """passed / failed / skipped / errors ... from pytest's last summary line."""
    summary = next(
        (
            line
            for line in reversed(output.splitlines())
            if re.search(r"\d+ \w+.* in [\d.]+s", line)
        ),
        "",
    )
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for number, word in re.findall(r"(\d+) (\w+)", summary):
        key = "errors" if word in ("error", "errors") else word
        counts[key] = counts.get(key, 0) + int(number)
    return counts


def test_rows(name: str, counts: dict[str, int] | None, note: str = "") -> list[Row]:
    if counts is None:
        return [Row(f"tests: {name}", None, " failed", Goal(False, 0), shown=note or None)]
    bad = counts["failed"] + counts.get("errors", 0)
    shown = ", ".join(f"{n} {word}" for word, n in counts.items() if n or word != "errors")
    return [Row(f"tests: {name}", bad, " failed", Goal(False, 0), shown=shown)]


def engine_rows(runs: list[dict[str, Any]], wanted: list[int], size: str) -> list[Row]:
    """Rows from benchmarks/engine.py --json: per request count, the engine over the best
    other strategy, and its metered run (tok/s, peak GPU memory, roofline fraction)."""
    by_count = {run["requests"]: run for run in runs}
    rows = []
    for count in wanted:
        run = by_count.get(count)
        rates = run["tok_s"] if run else {}
        ours = next((rate for name, rate in rates.items() if name.startswith("(d)")), None)
        others = {name[:3]: rate for name, rate in rates.items() if not name.startswith("(d)")}
        best = max(others, key=lambda k: others[k]) if others else None
        ratio = ours / others[best] if ours and best else None
        tag = f"{size}, {count} requests"
        rows.append(
            Row(
                f"engine / best other {best or ''} ({tag})".replace("  ", " "),
                ratio,
                "x",
                Goal(True, 1.5, ENGINE_SECTION),
            )
        )
        metered = run["metered"] if run else {}
        # The 1B shape's goal is written for the model, not per request count: the larger run.
        tok_goal = (
            Goal(True, 30_000, HOST_SECTION) if size == "1b" and count == max(wanted) else None
        )
        rows.append(
            Row(f"engine tok/s, metered run ({tag})", metered.get("tok_s"), " tok/s", tok_goal)
        )
        peak, total = metered.get("peak_gib"), metered.get("total_gib")
        shown = f"{peak:.1f} of {total:.0f} GiB" if peak is not None and total else None
        rows.append(Row(f"GPU memory peak ({tag})", peak, " GiB", shown=shown))
        rows.append(Row(f"roofline fraction ({tag})", metered.get("roofline"), "%"))
    return rows


def spare_rows(summary: dict[str, Any] | None) -> list[Row]:
    """Rows from benchmarks/spare_capacity.py --json: TTFT beside batch over alone (p50, p99),
    batch beside interactive over batch alone."""
    summary = summary or {}
    rows = []
    for name, limit in (("p50", 1.2), ("p99", 1.5)):
        ttft = summary.get(f"ttft_{name}_ms")
        ratio = ttft["beside_batch"] / ttft["alone"] if ttft and ttft["alone"] else None
        shown = (
            f"{ratio:.2f}x ({ttft['alone']:.0f} -> {ttft['beside_batch']:.0f} ms)"
            if ratio is not None and ttft
            else None
        )
        rows.append(
            Row(
                f"interactive TTFT {name} beside batch / alone",
                ratio,
                "x",
                Goal(False, limit, SPARE_SECTION),
                shown,
            )
        )
    alone, during = summary.get("batch_alone_tok_s"), summary.get("batch_during_tok_s")
    share = during / alone if alone and during is not None else None
    rows.append(
        Row("batch beside interactive / batch alone", share, "%", Goal(True, 0.5, SPARE_SECTION))
    )
    return rows


# -- the device ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    gpus: int = 0
    name: str = ""
    free_gib: float = 0.0
    total_gib: float = 0.0
    generate_batch: bool = True  # transformers' continuous batching (the engine part's (c))
    problem: str = ""  # why there is no device to check, where the probe says so


_PROBE = """
import json, torch
out = {"gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0}
if out["gpus"]:
    free, total = torch.cuda.mem_get_info(0)
    out.update(name=torch.cuda.get_device_name(0), free_gib=free / 2**30, total_gib=total / 2**30)
    try:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa
    except ImportError:
        out["generate_batch"] = False
print(json.dumps(out))
"""


def probe_device(timeout: float = 120.0) -> Device:
    """What the machine has, asked in a subprocess (this process never holds a CUDA context)."""
    try:
        done = subprocess.run(
            [PYTHON, "-c", _PROBE], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return Device(problem=f"the CUDA probe did not answer in {timeout:.0f} s")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Device(problem=f"the CUDA probe failed: {last}")
    return Device(**json.loads(done.stdout.strip().splitlines()[-1]))


# -- the parts ----------------------------------------------------------------------------


@dataclass
class Part:
    name: str
    argv: list[str]
    timeout: float
    rows: Callable[[Outcome], list[Row]]
    json_out: Path | None = None
    hang_fails: bool = False  # a run stopped at its timeout counts as failed (tests)


@dataclass
class Outcome:
    part: Part
    returncode: int | None = None  # None: not started (skipped) or stopped at its timeout
    timed_out: bool = False
    output: str = ""
    seconds: float = 0.0
    skipped: str = ""  # why it did not run
    log: Path | None = None

    @property
    def failed(self) -> bool:
        """Exited non-zero (a test failed, a benchmark crashed), or hung where that fails."""
        return self.returncode not in (None, 0) or (self.timed_out and self.part.hang_fails)

    def json(self) -> Any:
        path = self.part.json_out
        if path is None or not path.exists():
            return None
        return json.loads(path.read_text())


@dataclass
class Plan:
    parts: list[Part] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # one line per thing the device lacks


TEST_FILES = {
    "CUDA graphs": ("tests/inference/test_engine_graphs.py", 1),
    "tensor parallel": ("tests/inference/test_tensor_parallel.py", 2),
}


def make_plan(device: Device, logs: Path, *, quick: bool, cpu: bool, have_pytest: bool) -> Plan:
    """The parts this device can run, and one line for each thing it lacks."""
    plan = Plan()
    gpus = device.gpus
    tests = []
    for name, (path, needs) in TEST_FILES.items():
        if gpus >= needs or (cpu and needs == 1):
            tests.append((name, path))
        else:
            plan.missing.append(f"{name} tests need {needs} GPUs, this machine has {gpus}: skipped")
    if not have_pytest:
        plan.missing.append("pytest is not installed (`make install` adds it): tests skipped")
    elif tests:
        argv = [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(p for _, p in tests)]
        rows = partial(outcome_test_rows, names=", ".join(name for name, _ in tests))
        plan.parts.append(Part("tests", argv, 90 if quick else 180, rows, hang_fails=True))

    size = "tiny" if cpu else "1b"
    counts = [16] if quick else [64, 256]
    engine_json = logs / "engine.json"
    engine = [PYTHON, "benchmarks/engine.py", "--model-size", size, "--requests", *map(str, counts)]
    engine += ["--rounds", "1" if quick else "2", "--single-sample", "2" if quick else "8"]
    engine += ["--json", str(engine_json)] + (["--device", "cpu"] if cpu else [])
    if not device.generate_batch:
        plan.missing.append(
            "transformers has no ContinuousBatchingConfig: "
            "the engine part leaves out (c) generate_batch"
        )
        engine += ["--skip", "c"]
    if cpu or device.free_gib >= ENGINE_MEMORY_GIB:
        rows = partial(outcome_engine_rows, counts=counts, size=size)
        plan.parts.append(Part("engine", engine, 120 if quick else 240, rows, engine_json))
    else:
        plan.missing.append(
            f"the engine part needs {ENGINE_MEMORY_GIB:.0f} GiB of free GPU memory, "
            f"GPU 0 has {device.free_gib:.1f}: skipped"
        )

    spare_json = logs / "spare_capacity.json"
    spare = [PYTHON, "benchmarks/spare_capacity.py", "--seconds", "3" if quick else "15"]
    spare += ["--rounds", "1", "--json", str(spare_json)] + (["--device", "cpu"] if cpu else [])
    if cpu or device.free_gib >= SPARE_MEMORY_GIB:
        plan.parts.append(
            Part("spare capacity", spare, 60 if quick else 120, outcome_spare_rows, spare_json)
        )
    else:
        plan.missing.append(
            f"the spare-capacity part needs {SPARE_MEMORY_GIB:.0f} GiB of free GPU memory, "
            f"GPU 0 has {device.free_gib:.1f}: skipped"
        )
    return plan


def outcome_test_rows(outcome: Outcome, names: str) -> list[Row]:
    if outcome.skipped or outcome.timed_out:
        return test_rows(names, None, outcome.skipped or "timed out")
    counts = pytest_counts(outcome.output)
    if outcome.failed and not counts["failed"] and not counts.get("errors"):
        counts["errors"] = 1  # pytest itself failed (collection, usage): counted as one
    return test_rows(names, counts)


def outcome_engine_rows(outcome: Outcome, counts: list[int], size: str) -> list[Row]:
    return engine_rows(outcome.json() or [], counts, size)


def outcome_spare_rows(outcome: Outcome) -> list[Row]:
    return spare_rows(outcome.json())


def run_part(part: Part, timeout: float, logs: Path) -> Outcome:
    """Runs `part` with its output in a log file; stopped (the whole process group) at
    `timeout`, keeping what it printed."""
    log = logs / f"{part.name.replace(' ', '_')}.log"
    if part.json_out is not None:
        part.json_out.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.setdefault("HF_HUB_OFFLINE", "1")
    began = time.monotonic()
    outcome = Outcome(part, log=log)
    with log.open("w") as out:
        process = subprocess.Popen(
            part.argv,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            outcome.returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            outcome.timed_out = True
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    outcome.seconds = time.monotonic() - began
    outcome.output = log.read_text(errors="replace")
    return outcome


def describe(outcome: Outcome) -> str:
    if outcome.skipped:
        return f"{outcome.part.name}: skipped ({outcome.skipped})"
    state = (
        f"timed out after {outcome.seconds:.0f} s"
        if outcome.timed_out
        else f"exit {outcome.returncode} in {outcome.seconds:.0f} s"
    )
    return f"{outcome.part.name}: {state}; log {outcome.log}"


def command_line(argv: list[str]) -> str:
    """`argv` as one would type it in the repository root."""

    def short(arg: str) -> str:
        path = Path(arg)
        return (
            str(path.relative_to(ROOT)) if path.is_absolute() and path.is_relative_to(ROOT) else arg
        )

    return " ".join(map(short, argv))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shrink every part (a dry run)")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for all parts")
    parser.add_argument("--logs", type=Path, default=ROOT / "var/gpu-check")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU anyway (a try)")
    args = parser.parse_args(argv)
    began = time.monotonic()

    import importlib.util

    if importlib.util.find_spec("torch") is None:
        print("torch is not installed (`make install`): nothing to check")
        return 0
    device = probe_device()
    if device.problem:
        print(device.problem)
    have_pytest = importlib.util.find_spec("pytest") is not None
    logs = args.logs.resolve()
    if not device.gpus and not args.cpu:
        print("no CUDA device: nothing to check. On one GPU this would run:")
        one_gpu = Device(gpus=1, free_gib=math.inf)
        for part in make_plan(one_gpu, logs, quick=args.quick, cpu=False, have_pytest=True).parts:
            print(f"  {part.name} (at most {part.timeout:.0f} s): {command_line(part.argv)}")
        print(f"  and with 2 GPUs or more, the {TEST_FILES['tensor parallel'][0]} tests too")
        return 0
    plan = make_plan(device, logs, quick=args.quick, cpu=args.cpu, have_pytest=have_pytest)

    where = (
        f"{device.gpus} x {device.name}, {device.free_gib:.0f} of {device.total_gib:.0f} GiB free"
    )
    print(f"device: {where if device.gpus else 'CPU (--cpu: figures mean nothing)'}", flush=True)
    for line in plan.missing:
        print(line, flush=True)
    logs.mkdir(parents=True, exist_ok=True)
    outcomes = []
    for part in plan.parts:
        left = args.budget - (time.monotonic() - began)
        if left < MIN_PART_S:
            outcome = Outcome(part, skipped=f"budget spent: {left:.0f} s of {args.budget:.0f} left")
        else:
            print(f"{part.name}: {command_line(part.argv)}", flush=True)
            outcome = run_part(part, min(part.timeout, left), logs)
        print(describe(outcome), flush=True)
        outcomes.append(outcome)

    rows = [row for outcome in outcomes for row in outcome.part.rows(outcome)]
    print()
    if args.quick:
        print("--quick: small runs that try the plumbing; do not record these figures")
    print(render_table(rows))
    failed = [o.part.name for o in outcomes if o.failed]
    if failed:
        print(f"failed: {', '.join(failed)} (see the logs)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
