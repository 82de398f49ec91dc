"""Conditional and range requests for file content (RFC 9110 §13, §14), single ranges only."""

from __future__ import annotations

import re

from boardwalk.errors import BoardwalkError, ErrorCode, RangeNotSatisfiable


class PreconditionFailed(BoardwalkError):
    status = 412
    code = ErrorCode.PRECONDITION_FAILED


def _tags(header: str) -> list[str]:
    return [tag.strip() for tag in header.split(",") if tag.strip()]


def not_modified(*, if_match: str | None, if_none_match: str | None, etag: str) -> bool:
    """Evaluate If-Match then If-None-Match for a GET (RFC 9110 §13.2.2).

    Raises PreconditionFailed (412) when If-Match names neither `*` nor this ETag (strong
    comparison); True when If-None-Match matches (weak comparison): answer 304.
    """
    if if_match is not None:
        tags = _tags(if_match)
        if "*" not in tags and etag not in tags:
            raise PreconditionFailed("The file's ETag does not match If-Match.", param="If-Match")
    if if_none_match is not None:
        tags = [tag.removeprefix("W/") for tag in _tags(if_none_match)]
        return "*" in tags or etag.removeprefix("W/") in tags
    return False


_RANGE = re.compile(r"^bytes=([0-9]*)-([0-9]*)$")
# Past any file we store; int() of a longer digit string is refused by Python (4,300 digits)
# and pointless: such a number means "beyond the end".
_HUGE = 10**18


def _number(digits: str) -> int:
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) < 18 else _HUGE


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
        length = _number(last)
        if length == 0 or size == 0:
            raise _unsatisfiable(size)
        return max(0, size - length), size - 1
    start = _number(first)
    end = _number(last) if last else size - 1
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
