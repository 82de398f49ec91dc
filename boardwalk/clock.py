"""The one clock that expiry, retention and deadlines read (docs/ARCHITECTURE.md decision 7).

Tests move it with `clock.travel(...)`; no test sleeps to wait for time to pass.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager

from django.utils import timezone

_offset = dt.timedelta(0)


def now() -> dt.datetime:
    return timezone.now() + _offset


def unix(value: dt.datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


@contextmanager
def travel(delta: dt.timedelta) -> Iterator[None]:
    """Move the clock forward by `delta` for the duration of the block."""
    global _offset
    previous = _offset
    _offset = previous + delta
    try:
        yield
    finally:
        _offset = previous
