"""Keep the memory an engine frees in the process instead of handing it back to the kernel.

glibc serves a large allocation (above 128 KiB at first) from a fresh `mmap` and unmaps it
when freed, and trims the top of its heap once twice that much of it is free; the threshold
moves with what the process happened to free before. A CPU forward allocates and frees its
activations every step, so depending on that history the steps touched new pages again and
again: about 500,000 minor page faults (each a trip to the kernel to map and zero a page) in
a 7-second run of 256 requests on the tiny demo model, and the same engine ran 1.3x faster in
a process where the threshold had settled than in one where it had not. With allocations up
to 32 MiB kept in the heap and the heap never trimmed, the run faults under 1,000 times
wherever it runs (docs/PERFORMANCE.md, "Engine": its Allocator paragraph).

The price: a process that ran an engine keeps its peak host memory of freed blocks (for
reuse by its next steps) rather than returning it. Elsewhere than glibc (musl, macOS) nothing
changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading

logger = logging.getLogger(__name__)

# glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's upper limit for the threshold on 64-bit
TRIM_THRESHOLD_BYTES = (1 << 31) - 1  # mallopt takes an int: in effect, never trim

_lock = threading.Lock()
_done = False


def keep_freed_memory() -> bool:
    """Tune this process's allocator once (see the module doc); True when glibc took it."""
    global _done
    with _lock:
        if _done:
            return True
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # not glibc
            return False
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
        _done = bool(
            mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
            and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
        )
        if not _done:
            logger.info("the allocator could not be tuned; the engine runs with its defaults")
        return _done
