"""Interactive rows ahead of batch rows for an external revision's in-flight slots.

Every row of an `ExternalEngine` waits for a slot of the revision's in-flight limit
(`inference.external.limits`), which knows no classes: a freed slot goes to whichever waiter
polls first. `Turns` puts the engine's interactive rows (`priority` > 0, as the engine's own
scheduler ranks them) first among its own: while one of them waits for a slot, batch rows of
the same engine do not start waiting, and a batch row that got a slot meanwhile gives it
straight back (unused, so the limit does not move) and waits until no interactive row does.
The interactive row still waits for a slot like any other: the revision's limit bounds it,
and rows of other worker processes are not held back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from inference.external.limits import Held, InFlightLimit

__all__ = ["Turns"]


class Turns:
    """One engine's rows taking slots of `limit`, interactive first (used from one asyncio
    loop)."""

    def __init__(self, limit: InFlightLimit) -> None:
        self.limit = limit
        self._urgent = 0  # interactive rows waiting for a slot
        self._calm = asyncio.Event()  # set while none does
        self._calm.set()

    @property
    def urgent(self) -> int:
        return self._urgent

    @contextlib.asynccontextmanager
    async def held(self, *, priority: int, deadline: float | None) -> AsyncIterator[Held | None]:
        """`limit.held(deadline=…)`, with interactive rows served before batch rows; None
        when the deadline came before a slot."""
        if priority > 0:
            self._urgent += 1
            self._calm.clear()
            waiting = True
            try:
                async with self.limit.held(deadline=deadline) as held:
                    waiting = False
                    self._left()
                    yield held
            finally:
                if waiting:
                    self._left()
            return
        while True:
            if not await self._wait_calm(deadline):
                yield None
                return
            async with self.limit.held(deadline=deadline) as held:
                if held is None or not self._urgent:
                    yield held
                    return
            # An interactive row began waiting meanwhile: the slot went back (unused) and
            # woke it; this row waits its turn.

    def _left(self) -> None:
        self._urgent -= 1
        if not self._urgent:
            self._calm.set()

    async def _wait_calm(self, deadline: float | None) -> bool:
        """Wait until no interactive row waits; False when the deadline came first."""
        if self._calm.is_set():
            return True
        timeout = None if deadline is None else max(0.0, deadline - time.time())
        try:
            await asyncio.wait_for(self._calm.wait(), timeout)
        except TimeoutError:
            return False
        return True
