"""A streaming reader of multipart/form-data bodies (RFC 7578, framing of RFC 2046 §5.1.1).

POST /v1/files reads its body with this rather than Django's MultiPartParser: a 256 MiB upload
goes by in reads of about 1 MiB, each handed on as it came (no copy) unless a delimiter, or
the start of one, lies in it. Memory holds one read, one part's header block and the small
tail of a read that may begin a delimiter split across two reads.

The reader checks the framing only; which fields a form may carry is the caller's business.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from django.utils.http import parse_header_parameters

READ_SIZE = 1024 * 1024
MAX_HEADER_BYTES = 16 * 1024
# RFC 2046 §5.1.1: 1 to 70 characters from this set, the last not a space.
_BCHARS = frozenset(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'()+_,-./:=? ")
# CRs looked at one by one before searching for the whole delimiter instead.
_CR_PROBES = 32
# Bodies we can take as they come; base64 or quoted-printable parts would need decoding.
_IDENTITY_ENCODINGS = frozenset({"7bit", "8bit", "binary"})


class MultipartError(Exception):
    """The body is not well-formed multipart/form-data; the message says how, for the client."""


class IncompleteBody(MultipartError):
    """The body ended before the closing delimiter."""


@dataclass(frozen=True)
class Part:
    name: str
    filename: str | None


def multipart_boundary(content_type: str | None) -> bytes | None:
    """The boundary of a `multipart/form-data` Content-Type; None for any other media type.

    MultipartError when it is multipart/form-data with a missing or malformed boundary.
    """
    try:
        media_type, params = parse_header_parameters(content_type or "")
    except ValueError:
        return None
    if media_type != "multipart/form-data":
        return None
    boundary = params.get("boundary", "")
    try:
        raw = boundary.encode("ascii")
    except UnicodeEncodeError:
        raw = b""
    if not (1 <= len(raw) <= 70) or raw.endswith(b" ") or not set(raw) <= _BCHARS:
        raise MultipartError(
            "The Content-Type multipart/form-data needs a boundary of 1 to 70 letters, digits "
            "or '()+_,-./:=? characters."
        )
    return raw


class MultipartReader:
    """Parts of a multipart body, read from `read(n)` (a file's or a request's `read`).

    Call `next_part()`, then consume that part with `chunks()`, `read_value()` or `skip()`;
    `next_part()` skips whatever is left of the previous part. It returns None after the
    closing delimiter; IncompleteBody if the body ends first.
    """

    def __init__(
        self,
        read: Callable[[int], bytes],
        boundary: bytes,
        *,
        read_size: int = READ_SIZE,
        max_header_bytes: int = MAX_HEADER_BYTES,
    ) -> None:
        self._read = read
        self._read_size = read_size
        self._max_header_bytes = max_header_bytes
        # RFC 2046: the delimiter is CRLF "--" boundary, its CRLF part of the delimiter, not
        # of the body before it. The first one may open the body: a virtual CRLF in front
        # lets a single search find it there or after a preamble.
        self._delimiter = b"\r\n--" + boundary
        self._buffer = b"\r\n"
        self._pos = 0
        self._eof = False
        self._in_body = True  # the preamble is skipped like the body of a part
        self._in_preamble = True
        self._done = False

    def next_part(self) -> Part | None:
        if self._done:
            return None
        if self._in_body:
            self.skip()
        self._in_preamble = False
        # Just past a delimiter: "--" closes the body, else padding and CRLF end the line.
        self._fill(2)
        if self._buffer.startswith(b"--", self._pos):
            self._done = True
            return None
        headers = self._header_block()
        part = _parse_part_headers(headers)
        self._in_body = True
        return part

    def chunks(self) -> Iterator[bytes]:
        """The current part's body, in pieces as read; empty once consumed."""
        if not self._in_body:
            return
        delimiter = self._delimiter
        size = len(delimiter)
        while True:
            buffer, pos = self._buffer, self._pos
            found = _find_delimiter(buffer, pos, delimiter)
            if found >= 0:
                self._pos = found + size
                self._in_body = False
                if found > pos:
                    yield buffer[pos:found]
                return
            keep = _partial_delimiter_start(buffer, pos, delimiter)
            if keep > pos:
                # The common case, a whole read with no delimiter in sight, goes out as is.
                yield buffer if pos == 0 and keep == len(buffer) else buffer[pos:keep]
            more = self._next_read()
            if not more:
                if self._in_preamble:
                    raise MultipartError("The boundary of the Content-Type never appears.")
                raise IncompleteBody("The body ended inside a part, before its closing boundary.")
            self._buffer = buffer[keep:] + more if keep < len(buffer) else more
            self._pos = 0

    def read_value(self, limit: int) -> bytes:
        """The whole body of the current part; MultipartError beyond `limit` bytes."""
        value = bytearray()
        for chunk in self.chunks():
            value += chunk
            if len(value) > limit:
                raise MultipartError(f"A form field is larger than {limit} bytes.")
        return bytes(value)

    def skip(self) -> None:
        for _ in self.chunks():
            pass

    def drain(self) -> None:
        """Read and drop the rest of the input (the epilogue), so the request is read whole."""
        self._buffer, self._pos = b"", 0
        while self._next_read():
            pass

    def _next_read(self) -> bytes:
        if self._eof:
            return b""
        data = self._read(self._read_size)
        if not data:
            self._eof = True
        return bytes(data)

    def _fill(self, count: int) -> bool:
        """Have at least `count` unread bytes buffered; False if the input ends first."""
        while len(self._buffer) - self._pos < count:
            more = self._next_read()
            if not more:
                return False
            self._buffer = self._buffer[self._pos :] + more
            self._pos = 0
        return True

    def _header_block(self) -> bytes:
        """Consume the rest of the delimiter line and the part's headers; return the headers."""
        limit = self._max_header_bytes
        while True:
            buffer, pos = self._buffer, self._pos
            line_end = buffer.find(b"\r\n", pos, pos + limit)
            if line_end >= 0:
                if buffer[pos:line_end].strip(b" \t"):
                    raise MultipartError("A boundary line has extra characters after the boundary.")
                start = line_end + 2
                if buffer.startswith(b"\r\n", start):  # no header at all
                    self._pos = start + 2
                    return b""
                end = buffer.find(b"\r\n\r\n", start, start + limit)
                if end >= 0:
                    self._pos = end + 4
                    return buffer[start:end]
            if len(buffer) - pos > limit + 4:
                raise MultipartError(f"A part's headers are longer than {limit} bytes.")
            if not self._fill(len(buffer) - pos + 1):
                raise IncompleteBody("The body ended inside a part's headers.")


def _find_delimiter(buffer: bytes, pos: int, delimiter: bytes) -> int:
    """buffer.find(delimiter, pos), faster where CR is rare, as in a JSONL body.

    A search for the CR that opens the delimiter runs at memchr speed, several times faster
    than a search for the whole delimiter; where CRs abound, the plain search takes over.
    """
    for _ in range(_CR_PROBES):
        candidate = buffer.find(b"\r", pos)
        if candidate < 0 or buffer.startswith(delimiter, candidate):
            return candidate
        pos = candidate + 1
    return buffer.find(delimiter, pos)


def _partial_delimiter_start(buffer: bytes, pos: int, delimiter: bytes) -> int:
    """Where a tail of `buffer` that may begin `delimiter` starts (len(buffer) if none)."""
    size = len(buffer)
    candidate = buffer.find(b"\r", max(pos, size - len(delimiter) + 1))
    while candidate >= 0:
        if delimiter.startswith(buffer[candidate:]):
            return candidate
        candidate = buffer.find(b"\r", candidate + 1)
    return size


def _parse_part_headers(block: bytes) -> Part:
    disposition: str | None = None
    for raw_line in block.split(b"\r\n") if block else []:
        try:
            line = raw_line.decode("utf-8")
        except UnicodeDecodeError:
            raise MultipartError("A part header is not valid UTF-8.") from None
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or line[0] in " \t":
            raise MultipartError("A part header is malformed (folded lines are not accepted).")
        name, value = name.lower(), value.strip()
        if name == "content-disposition":
            if disposition is not None:
                raise MultipartError("A part has two Content-Disposition headers.")
            disposition = value
        elif name == "content-transfer-encoding" and value.lower() not in _IDENTITY_ENCODINGS:
            raise MultipartError("Send each part as it is: no Content-Transfer-Encoding.")
        # RFC 7578 §4.8: any other header field (Content-Type included) is ignored.
    if disposition is None:
        raise MultipartError("A part has no Content-Disposition header.")
    try:
        kind, params = parse_header_parameters(disposition)
    except ValueError:
        raise MultipartError("A part's Content-Disposition is malformed.") from None
    field_name = params.get("name")
    if kind != "form-data" or not field_name:
        raise MultipartError("Each part needs 'Content-Disposition: form-data; name=\"...\"'.")
    return Part(name=field_name, filename=params.get("filename"))
