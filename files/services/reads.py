"""Reads of file content: plaintext ranges, lines and request bodies, decrypted as they stream.

`file_read_range` serves a byte range (GET /v1/files/{id}/content, the worker's prepare),
falling back to the recovery copy when the primary cannot be read; `file_iter_lines` and
`file_iter_bodies` read many lines of an input file in one sequential pass, merging sectioned
files' sections into their requests (files/validation/sectioned.py). Nothing here writes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
from botocore.exceptions import BotoCoreError, ClientError

from boardwalk.codes import ErrorCode
from boardwalk.errors import ServiceUnavailable
from boardwalk.logs import exception_trace
from files.crypto import Keyring, TamperedContent
from files.models import File
from files.storage import content_store, open_plaintext_range
from files.validation.sectioned import effective_body

logger = logging.getLogger(__name__)


def file_read_range(*, file: File, start: int, end: int) -> Iterator[bytes]:
    """Plaintext bytes [start, end] (inclusive), decrypting only the chunks they span.

    Every chunk is authenticated before its bytes are yielded. When the primary blob is
    missing, unreadable or fails authentication, the rest of the range comes from the
    recovery copy (result files); when no copy can serve it, ServiceUnavailable with code
    `content_unavailable` (503).
    """
    data_key = Keyring.current().unwrap(file.key_id, file.wrapped_key)
    return _read_with_fallback(file, data_key, start, end)


def _read_with_fallback(file: File, data_key: bytes, start: int, end: int) -> Iterator[bytes]:
    store = content_store()
    names = [name for name in (file.storage_name, file.recovery_name) if name]
    position = start  # the first byte not yet yielded
    for attempt, name in enumerate(names):
        try:
            for piece in open_plaintext_range(
                store,
                name,
                data_key=data_key,
                aad_prefix=file.aad(),
                plaintext_size=file.bytes,
                start=position,
                end=end,
            ):
                yield piece
                position += len(piece)
            return
        except (OSError, TamperedContent, BotoCoreError, ClientError) as exc:
            # Type and frames only: messages of storage errors can carry bucket and key names.
            copy = "primary" if attempt == 0 else "recovery"
            logger.error(
                "file %s: the %s copy is unreadable at byte %s: %s",
                file.id,
                copy,
                position,
                exception_trace(exc),
            )
    raise ServiceUnavailable(
        f"The content of file {file.id} cannot be read from storage right now.",
        code=ErrorCode.CONTENT_UNAVAILABLE,
    )


def file_iter_lines(*, file: File, spans: Iterable[tuple[int, int]]) -> Iterator[bytes]:
    """The plaintext of each (offset, length) span, in one sequential decrypting pass.

    Spans must be in file order; memory holds one line and one decrypted piece at a time.
    """
    spans = list(spans)
    if not spans:
        return
    first_offset = spans[0][0]
    last_offset, last_length = spans[-1]
    end = last_offset + last_length - 1
    if end < first_offset:
        end = first_offset
    pieces = file_read_range(file=file, start=first_offset, end=min(end, file.bytes - 1))
    buffer = bytearray()
    base = first_offset  # file offset of buffer[0]
    for offset, length in spans:
        while base + len(buffer) < offset + length:
            piece = next(pieces, None)
            if piece is None:
                break
            buffer += piece
        start = offset - base
        yield bytes(buffer[start : start + length])
        del buffer[: start + length]
        base = offset + length


ItemSpan = tuple[int, int, int | None, int]  # offset, length, section offset (or None), length


def file_iter_bodies(*, file: File, spans: Iterable[ItemSpan]) -> Iterator[dict[str, Any]]:
    """The effective request body of each item, in one sequential decrypting pass.

    Spans must be in file order. For a sectioned file each span names its section line too; sections
    are parsed once each and merged into their requests (docs/API.md "BatchRouter sectioned input"),
    and a section always lies above its requests, so one forward pass reads both.
    """
    spans = list(spans)
    section_of = {offset: s_off for offset, _, s_off, _ in spans}
    sections = {(s_off, s_len) for _, _, s_off, s_len in spans if s_off is not None}
    lines = sorted({(offset, length) for offset, length, _, _ in spans} | sections)
    parsed: dict[int, dict[str, Any]] = {}
    for (offset, length), data in zip(lines, file_iter_lines(file=file, spans=lines), strict=True):
        body = orjson.loads(data)["body"]
        if (offset, length) in sections:
            parsed[offset] = body
            continue
        section_offset = section_of[offset]
        yield body if section_offset is None else effective_body(parsed[section_offset], body)


def line_index_span(row: list[Any]) -> ItemSpan:
    """The ItemSpan of one File.line_index row (standard rows have no section)."""
    if len(row) > 5:
        return row[0], row[1], row[5], row[6]
    return row[0], row[1], None, 0
