"""The engine's allocator tuning: freed memory is reused, not mapped afresh by every step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Allocates two 8 MiB buffers and frees them, 50 times (every page touched); prints the minor
# page faults that took. With glibc's defaults the freed 16 MiB at the top of the heap is
# trimmed each time (the trim threshold follows the mmap threshold to twice 8 MiB), so every
# round maps and zeroes 4,096 pages again, as an engine's steps did.
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
    first, second = bytearray(8 << 20), bytearray(8 << 20)
    del first, second
print(faults() - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(root=str(ROOT)), mode],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_tuned_process_reuses_freed_memory_instead_of_faulting_it_in_again():
    default, tuned = _faults("default"), _faults("tuned")
    assert default > 50 * 1000  # every buffer mapped and zeroed anew
    assert tuned < default / 10


def test_tuning_is_idempotent():
    from inference.engine.allocator import keep_freed_memory

    first = keep_freed_memory()
    assert keep_freed_memory() is first
