"""HTTP Range / If-Range for file content (RFC 9110 §14), single ranges only."""

from __future__ import annotations

import re

from boardwalk.errors import RangeNotSatisfiable

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def requested_range(
    *, range_header: str | None, if_range: str | None, etag: str, size: int
) -> tuple[int, int] | None:
    """(start, end) inclusive for a 206, or None for the whole file with 200.

    Unparseable or multi-range headers are ignored (a full 200 is a valid answer); a
    syntactically valid range that misses the file raises 416.
    """
    if not range_header:
        return None
    if if_range is not None and if_range.strip() != etag:
        # Strong comparison only; a date or another ETag means "the file changed": send it all.
        return None
    match = _RANGE.match(range_header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # suffix: the last N bytes
        length = int(last)
        if length == 0 or size == 0:
            raise _unsatisfiable(size)
        return max(0, size - length), size - 1
    start = int(first)
    end = int(last) if last else size - 1
    if last and end < start:
        return None  # invalid range spec: ignore it
    if start >= size:
        raise _unsatisfiable(size)
    return start, min(end, size - 1)


def _unsatisfiable(size: int) -> RangeNotSatisfiable:
    return RangeNotSatisfiable(
        f"The requested range is outside the file (it has {size} bytes).",
        headers={"Content-Range": f"bytes */{size}"},
    )
