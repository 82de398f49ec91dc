"""benchmarks/gpu_check.py, the one command for the day a device is lent: its table and goals,
what it plans on the machine it finds, its timeouts and budget, and its no-CUDA path (the only
one this CPU machine runs in full)."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> Any:
    # By path: benchmarks/ is not a package, and tests/benchmarks/ would shadow its name.
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


gpu_check = _load()
Goal, Row, Device = gpu_check.Goal, gpu_check.Row, gpu_check.Device


def test_verdict_meets_a_goal_at_its_bound_and_says_when_there_is_nothing_to_judge() -> None:
    at_least, at_most = Goal(True, 1.5), Goal(False, 1.2)
    assert gpu_check.verdict(1.5, at_least) == "met"
    assert gpu_check.verdict(1.49, at_least) == "missed"
    assert gpu_check.verdict(1.2, at_most) == "met"
    assert gpu_check.verdict(1.87, at_most) == "missed"
    assert gpu_check.verdict(None, at_least) == "no figure"
    assert gpu_check.verdict(math.nan, at_most) == "no figure"
    assert gpu_check.verdict(3.0, None) == "-"


def test_the_table_has_one_line_a_check_with_figure_goal_and_verdict() -> None:
    rows = [
        Row("engine / best other (b)", 1.64, "x", Goal(True, 1.5, 'docs/PERFORMANCE.md "Engine"')),
        Row("batch beside interactive / alone", 0.54, "%", Goal(True, 0.5)),
        Row("engine tok/s", 31_250.0, " tok/s", Goal(True, 30_000)),
        Row("GPU memory peak", 5.12, " GiB", shown="5.1 of 80 GiB"),
        Row("roofline fraction", None, "%"),
    ]
    lines = gpu_check.render_table(rows).splitlines()

    assert len(lines) == 2 + len(rows)
    assert len({len(line) for line in lines}) == 1  # columns line up
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert cells[0] == ["check", "figure", "goal", "verdict"]
    assert cells[2] == [
        "engine / best other (b)",
        "1.64x",
        'at least 1.50x (docs/PERFORMANCE.md "Engine")',
        "met",
    ]
    assert cells[3][1:] == ["54.0 %", "at least 50.0 %", "met"]
    assert cells[4][1:] == ["31,250 tok/s", "at least 30,000 tok/s", "met"]
    assert cells[5][1:] == ["5.1 of 80 GiB", "-", "-"]
    assert cells[6][1:] == ["-", "-", "no figure"]


def test_pytest_counts_read_the_summary_line() -> None:
    output = "..s.\nSKIPPED [1] x.py:3: CUDA graphs need a GPU\n3 passed, 1 skipped in 2.31s\n"
    assert gpu_check.pytest_counts(output) == {"passed": 3, "failed": 0, "skipped": 1}
    long = "== 1 failed, 5 passed, 2 errors in 75.02s (0:01:15) =="
    assert gpu_check.pytest_counts(long) == {"passed": 5, "failed": 1, "skipped": 0, "errors": 2}


def _engine_run(count: int, best_other: float, ours: float) -> dict[str, Any]:
    return {
        "requests": count,
        "tok_s": {
            "(a) model.generate one at a time (8 req)": 100.0,
            "(b) model.generate sorted static batches of 32": best_other,
            "(c) transformers generate_batch (paged)": best_other / 2,
            "(d) engine, 32 rows": ours,
        },
        "metered": {"tok_s": ours, "peak_gib": 6.0, "total_gib": 80.0, "roofline": 0.41},
    }


def test_engine_rows_judge_the_engine_against_the_best_other_strategy() -> None:
    rows = gpu_check.engine_rows([_engine_run(64, 10_000.0, 18_000.0)], [64, 256], "1b")
    by_check = {row.check: row for row in rows}

    ratio = by_check["engine / best other (b) (1b, 64 requests)"]
    assert (
        ratio.figure == pytest.approx(1.8) and gpu_check.verdict(ratio.figure, ratio.goal) == "met"
    )
    assert by_check["engine tok/s, metered run (1b, 64 requests)"].goal is None
    assert by_check["GPU memory peak (1b, 64 requests)"].shown == "6.0 of 80 GiB"
    assert by_check["roofline fraction (1b, 64 requests)"].figure == 0.41
    # 256 requests never reported (the part was stopped): its rows say so, its goals stay.
    missing = [row for row in rows if "256 requests" in row.check]
    assert len(missing) == 4 and all(row.figure is None for row in missing)
    tok_goal = by_check["engine tok/s, metered run (1b, 256 requests)"].goal
    assert tok_goal is not None and tok_goal.value == 30_000


def test_spare_rows_are_ratios_to_the_runs_alone() -> None:
    summary = {
        "ttft_p50_ms": {"alone": 80.0, "beside_batch": 120.0},
        "ttft_p99_ms": {"alone": 200.0, "beside_batch": 260.0},
        "batch_alone_tok_s": 4000.0,
        "batch_during_tok_s": 1800.0,
    }
    p50, p99, batch = gpu_check.spare_rows(summary)
    assert (p50.figure, gpu_check.verdict(p50.figure, p50.goal)) == (1.5, "missed")
    assert p50.shown == "1.50x (80 -> 120 ms)"
    assert (p99.figure, gpu_check.verdict(p99.figure, p99.goal)) == (1.3, "met")
    assert (batch.figure, gpu_check.verdict(batch.figure, batch.goal)) == (0.45, "missed")
    assert all(row.figure is None for row in gpu_check.spare_rows(None))


def test_the_plan_fits_the_device_and_names_what_it_lacks(tmp_path: Path) -> None:
    def plan(device: Any, **options: Any) -> Any:
        return gpu_check.make_plan(
            device, tmp_path, quick=options.get("quick", False), cpu=False,
            have_pytest=options.get("have_pytest", True),
        )  # fmt: skip

    one = plan(Device(gpus=1, name="H100", free_gib=78.0, total_gib=80.0))
    assert [p.name for p in one.parts] == ["tests", "engine", "spare capacity"]
    tests, engine, _ = one.parts
    assert "-p" in tests.argv and "no:cacheprovider" in tests.argv
    assert tests.argv[-1] == "tests/inference/test_engine_graphs.py"
    assert one.missing == ["tensor parallel tests need 2 GPUs, this machine has 1: skipped"]
    assert engine.argv[engine.argv.index("--model-size") + 1] == "1b"
    assert engine.argv[engine.argv.index("--requests") + 1 :][:2] == ["64", "256"]

    two = plan(Device(gpus=2, free_gib=78.0))
    assert two.parts[0].argv[-1] == "tests/inference/test_tensor_parallel.py" and not two.missing

    small = plan(Device(gpus=1, free_gib=1.0, generate_batch=False), quick=True, have_pytest=False)
    assert small.parts == []
    assert any(line.startswith("pytest is not installed") for line in small.missing)
    assert any("engine part needs 8 GiB" in line for line in small.missing)
    assert any("spare-capacity part needs 2 GiB" in line for line in small.missing)
    assert any("leaves out (c)" in line for line in small.missing)

    quick = plan(Device(gpus=1, free_gib=78.0), quick=True)
    full = plan(Device(gpus=1, free_gib=78.0))
    assert all(q.timeout < f.timeout for q, f in zip(quick.parts, full.parts, strict=True))


def test_a_part_past_its_timeout_is_stopped_with_what_it_printed(tmp_path: Path) -> None:
    script = "import time; print('started', flush=True); time.sleep(120)"
    part = gpu_check.Part("hang", [sys.executable, "-c", script], 2, lambda o: [], hang_fails=True)

    outcome = gpu_check.run_part(part, 2, tmp_path)

    assert outcome.timed_out and outcome.returncode is None and outcome.failed
    assert "started" in outcome.output
    assert (tmp_path / "hang.log").read_text() == outcome.output


def test_a_failing_test_fails_the_check(tmp_path: Path) -> None:
    (tmp_path / "test_case.py").write_text(
        textwrap.dedent("""
            import pytest
            def test_passes(): pass
            def test_fails(): assert False
            @pytest.mark.skip(reason="no GPU")
            def test_skipped(): pass
        """)
    )
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tmp_path),
    ]
    rows = gpu_check.partial(gpu_check.outcome_test_rows, names="case")
    part = gpu_check.Part("tests", [*argv, str(tmp_path / "test_case.py")], 120, rows)

    outcome = gpu_check.run_part(part, 120, tmp_path)

    assert outcome.failed
    (row,) = part.rows(outcome)
    assert row.shown == "1 passed, 1 failed, 1 skipped"
    assert gpu_check.verdict(row.figure, row.goal) == "missed"


def test_with_the_budget_spent_every_part_is_skipped_with_a_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gpu_check.main(["--cpu", "--quick", "--budget", "0", "--logs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("skipped (budget spent") == 3  # tests, engine, spare capacity
    assert "no figure" in out


def test_without_cuda_it_says_so_and_what_it_would_run() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gpu_check.py")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "no CUDA device: nothing to check. On one GPU this would run:"
    assert any("benchmarks/engine.py --model-size 1b" in line for line in lines)
    assert any("benchmarks/spare_capacity.py" in line for line in lines)
    assert any("test_engine_graphs.py" in line for line in lines)
