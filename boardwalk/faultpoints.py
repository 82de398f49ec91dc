"""Test-only pause points, for the fault suite (tests/faults/).

`fault_point("name")` does nothing unless the process was started with
BOARDWALK_TEST_FAULT_POINT=name: then the process stops itself (SIGSTOP) the first time it
gets there, so a test can freeze it, or kill it, at an exact moment (holding row locks
inside a transaction, between taking an Idempotency-Key and creating the batch) instead of
hoping to catch it there. The test resumes it with SIGCONT or ends it with SIGKILL.

Never set it in production: a stopped process holds its locks until the database's
idle-in-transaction timeout ends its session.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from django.conf import settings

logger = logging.getLogger(__name__)

_fired: set[str] = set()
_lock = threading.Lock()


def fault_point(name: str) -> None:
    if name != settings.TEST_FAULT_POINT:
        return
    with _lock:
        if name in _fired:
            return
        _fired.add(name)
    logger.warning("test fault point %s reached: stopping pid %s", name, os.getpid())
    # Directed at this thread, so this thread takes the stop itself; and held here until the
    # stop has landed. A process-directed SIGSTOP may be taken by another thread while this
    # one runs on for a moment: seen here, it committed the transaction the point is in.
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    time.sleep(0.5)
