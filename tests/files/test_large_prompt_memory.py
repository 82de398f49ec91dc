"""Memory for one large prompt, measured in a fresh process.

benchmarks/large_prompt.py runs the server's steps on the largest line accepted (20 MiB, one
user message) — upload, the background count, acceptance counting it again, the worker's run
— and on a hostile 4 MiB line of 2M one-character values, and reports each step's peak RSS
(VmHWM) above the RSS before the first one. Before the fix the count took ~2.9 GB, the run
~3.6 GB: the prompt was tokenized in full although it could only fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.model  # the run loads the tiny demo model


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's VmHWM")
def test_a_20_mib_prompt_and_a_hostile_line_cost_a_bounded_amount_of_memory() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "large_prompt.py"), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])

    assert result["line_bytes"] == 20 * 1024 * 1024
    # Longer than the tiny model's 2,048-token context: counted as one token more, never
    # tokenized, and failed by the worker before the engine.
    assert result["prompt_tokens"] == [2049]
    assert result["item_errors"] == ["context_length_exceeded"]
    assert result["hostile_answer"] == [400, ["too_many_values"]]

    # A 900 KiB interactive prompt is refused by its length, before any worker, for next to
    # nothing (counting it in full, reported beside it, is the path before issue 38).
    assert result["interactive_answer"] == [400, "context_length_exceeded"]

    growth = result["peak_growth_mib"]
    assert set(growth) == {
        "hostile",
        "upload",
        "count",
        "accept",
        "run",
        "interactive",
        "interactive_unbounded",
    }
    for step in ("upload", "count", "accept", "run"):
        assert growth[step] < 128, (step, growth)
    assert growth["hostile"] < 64, growth
    assert growth["interactive"] < 16, growth
