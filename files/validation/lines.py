"""Cut a byte stream into lines while holding at most one line.

Chunks may end anywhere: mid-line, mid-UTF-8 character, or between "\\r" and "\\n". A line that
lies inside one chunk is handed out as a memoryview of that chunk (no copy); only a line that
spans chunks is gathered in a buffer. A line over the limit is never gathered: its bytes are
dropped up to the next "\\n" and it is handed out without data.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

_NL = 0x0A
_CR = 0x0D


class Line(NamedTuple):
    number: int  # 1-based
    offset: int  # byte offset of the line start
    length: int  # bytes without the "\n" or "\r\n" terminator
    data: memoryview | bytearray | None  # None: longer than the limit, not kept


class LineSplitter:
    def __init__(self, max_line_bytes: int) -> None:
        self.max_line_bytes = max_line_bytes
        self.line_count = 0  # lines ended so far
        self.total_bytes = 0
        self._buffer = bytearray()  # the open line, when it spans chunks
        self._line_start = 0  # offset of the open (or next) line
        self._skipping = False  # the open line is over the limit: drop its bytes
        self._skipped = 0  # bytes of the open line while skipping
        self._skipped_cr = False  # while skipping, the last byte seen was "\r"
        self._counting = False  # past the line limit: only count lines
        self._open = False  # while counting, a line has started and not ended

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def count_only(self) -> None:
        """From the next line on, only count lines (call between lines, i.e. while iterating)."""
        self._counting = True
        self._open = False
        self._buffer = bytearray()
        self._skipping = False

    def feed(self, data: bytes) -> Iterator[Line]:
        """Yield each line that `data` ends; the caller must consume it before the next one."""
        if not isinstance(data, bytes):
            data = bytes(data)
        size = len(data)
        base = self.total_bytes
        self.total_bytes += size
        pos = 0
        view = memoryview(data)
        while pos < size:
            if self._counting:
                self._count(data, pos)
                return
            newline = data.find(b"\n", pos)
            if newline < 0:
                self._hold(view, pos, size)
                return
            yield self._end_line(view, pos, newline)
            pos = newline + 1
            self._line_start = base + pos

    def finish(self) -> Line | None:
        """The last line, when the stream does not end with a line terminator."""
        if self._counting:
            if self._open:
                self.line_count += 1
            return None
        if self._skipping:
            self.line_count += 1
            return Line(self.line_count, self._line_start, self._skipped, None)
        if not self._buffer:
            return None
        self.line_count += 1
        buffer, self._buffer = self._buffer, bytearray()
        # With no "\n" after it, a final "\r" is not a terminator: it belongs to the line.
        data = buffer if len(buffer) <= self.max_line_bytes else None
        return Line(self.line_count, self._line_start, len(buffer), data)

    def _count(self, data: bytes, pos: int) -> None:
        self.line_count += data.count(b"\n", pos)
        self._open = data[-1] != _NL

    def _hold(self, view: memoryview, pos: int, end: int) -> None:
        """Keep the start of a line that continues in the next chunk."""
        if self._skipping:
            self._skipped += end - pos
            self._skipped_cr = view[end - 1] == _CR
            return
        held = len(self._buffer) + end - pos
        # One byte of slack: a "\r" that the next chunk may turn into a terminator.
        if held > self.max_line_bytes + 1:
            self._skipping = True
            self._skipped = held
            self._skipped_cr = view[end - 1] == _CR
            self._buffer = bytearray()
            return
        self._buffer += view[pos:end]

    def _end_line(self, view: memoryview, pos: int, newline: int) -> Line:
        self.line_count += 1
        number, offset, limit = self.line_count, self._line_start, self.max_line_bytes
        if self._skipping:
            length = self._skipped + newline - pos
            if (view[newline - 1] == _CR) if newline > pos else self._skipped_cr:
                length -= 1
            self._skipping = False
            return Line(number, offset, length, None)

        end = newline - 1 if newline > pos and view[newline - 1] == _CR else newline
        if not self._buffer:
            length = end - pos
            return Line(number, offset, length, view[pos:end] if length <= limit else None)

        buffer, self._buffer = self._buffer, bytearray()
        if newline == pos and buffer[-1] == _CR:  # "\r" | "\n" split across chunks
            del buffer[-1]
        length = len(buffer) + end - pos
        if length > limit:
            return Line(number, offset, length, None)
        buffer += view[pos:end]
        return Line(number, offset, length, buffer)
