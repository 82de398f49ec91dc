"""What one `generate` call of the engine process (process.py) has sent its child, and how far
ahead of their results it may send.

`generate` feeds its source from a thread of its own: each request waits for a unit of
`Credit` (the requests the child may hold without a result; an interactive one goes past it)
and is noted in the call's `Feeding` as it is sent. The call is over once the source is
exhausted and every request sent was answered; a call stopped early aborts what `Feeding`
still holds.
"""

from __future__ import annotations

import threading


class Feeding:
    """One `generate` call's requests: those sent and not answered, and whether the source
    is exhausted (the call is over once it is and every request sent was answered)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._out: set[str] = set()
        self._exhausted = False
        self.stopped = False

    def sent(self, request_id: str) -> bool:
        """Note a request about to be sent; False once the call has stopped."""
        with self._lock:
            if self.stopped:
                return False
            self._out.add(request_id)
            return True

    def answered(self, request_id: str) -> None:
        with self._lock:
            self._out.discard(request_id)

    def exhausted(self) -> None:
        with self._lock:
            self._exhausted = True

    def over(self) -> bool:
        with self._lock:
            return self._exhausted and not self._out

    def stop(self) -> set[str]:
        """End the call: nothing more is sent; returns what was sent and not answered."""
        with self._lock:
            self.stopped = True
            return set(self._out)


class Credit:
    """Requests the child may hold without a result. When it is spent, an interactive request
    goes past it (what was overdrawn comes back before any credit is given again)."""

    def __init__(self, credit: int) -> None:
        self._free = threading.Semaphore(credit)
        self._lock = threading.Lock()
        self._overdrawn = 0

    def acquire(self, timeout: float, *, interactive: bool) -> bool:
        if self._free.acquire(timeout=0 if interactive else timeout):
            return True
        if interactive:
            with self._lock:
                self._overdrawn += 1
            return True
        return False

    def release(self) -> None:
        with self._lock:
            if self._overdrawn:
                self._overdrawn -= 1
                return
        self._free.release()
