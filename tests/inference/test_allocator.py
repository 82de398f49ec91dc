"""The engine's allocator tuning: freed memory is reused, not mapped afresh by every step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Allocates three 8 MiB buffers and frees them, 50 times (every page touched); prints the
# minor page faults that took. glibc's own thresholds move with what the process freed
# before (the first free of a mapped buffer raises them, and then the heap top is trimmed
# or not depending on sizes), so both processes start from its initial ones, pinned at
# 128 KiB: every buffer is its own mmap, mapped and zeroed anew, as an engine's activations
# were. The tuned process then overrides them.
_SCRIPT = """
import resource, sys
sys.path.insert(0, {root!r})
if sys.argv[1] == "tuned":
    from inference.engine.allocator import keep_freed_memory
    assert keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
bytearray(8 << 20)  # the first one may fault in either case
before = faults()
for _ in range(50):
    buffers = [bytearray(8 << 20) for _ in range(3)]
    del buffers
print(faults() - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(root=str(ROOT)), mode],
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_tuned_process_reuses_freed_memory_instead_of_faulting_it_in_again():
    default, tuned = _faults("default"), _faults("tuned")
    assert default > 150 * 2000  # every buffer mapped and zeroed anew (2,048 pages each)
    assert tuned < default / 10


def test_tuning_is_idempotent():
    from inference.engine.allocator import keep_freed_memory

    first = keep_freed_memory()
    assert keep_freed_memory() is first
