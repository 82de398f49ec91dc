"""Writes for files: store an upload, publish a result file, delete, serve ranges."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from botocore.exceptions import BotoCoreError, ClientError
from django.db import transaction
from django.db.models import QuerySet

from boardwalk import clock
from boardwalk.codes import ErrorCode
from boardwalk.errors import (
    CapacityExceeded,
    Conflict,
    InvalidRequest,
    PayloadTooLarge,
    ServiceUnavailable,
)
from boardwalk.logs import exception_trace
from boardwalk.models import Organization
from files.crypto import Keyring, TamperedContent, UnknownMasterKey, new_data_key
from files.limits import MAX_INPUT_BYTES, MAX_RETAINED_INPUT_BYTES, RESULT_TTL, UNUSED_INPUT_TTL
from files.models import File
from files.selectors import retained_input_bytes
from files.storage import EncryptedSpool, content_store, open_plaintext_range
from files.upload import ReceivedUpload
from files.validation.sectioned import effective_body

logger = logging.getLogger(__name__)


RECOVERY_PREFIX = "recovery"


def _storage_name(file_id: str) -> str:
    return f"files/{file_id}.enc"


def file_create_from_upload(*, org: Organization, purpose: str, upload: ReceivedUpload) -> File:
    """Store a validated upload as an input file. The caller already streamed and validated."""
    if upload.too_large:
        raise PayloadTooLarge(
            f"The file is larger than {MAX_INPUT_BYTES // (1024 * 1024)} MiB; split it into "
            "several batches.",
            code=ErrorCode.FILE_TOO_LARGE,
            param="file",
        )
    report = upload.report
    if report is None:  # the multipart body ended inside the file part
        upload.spool.discard()
        raise InvalidRequest(
            "The upload was incomplete; send the whole file.", code=ErrorCode.INCOMPLETE_UPLOAD
        )
    if purpose != File.Purpose.BATCH:
        upload.spool.discard()
        raise InvalidRequest(
            "Only purpose 'batch' can be uploaded.", code=ErrorCode.INVALID_PURPOSE, param="purpose"
        )
    if not report.ok:
        upload.spool.discard()
        shown = len(report.errors)
        more = report.error_count - shown
        message = f"The input file has {report.error_count} error(s)"
        message += f"; the first {shown} are listed in details." if more else "; see details."
        # Each line error's message starts "Line N: " already.
        message += f" First: {report.errors[0].message}"
        raise InvalidRequest(
            message,
            code=ErrorCode.INVALID_INPUT_FILE,
            param="file",
            details=[
                {"line": e.line, "field": e.field, "code": e.code, "message": e.message}
                for e in report.errors
            ],
            extra={"error_count": report.error_count},
        )
    if retained_input_bytes(org=org) + report.total_bytes > MAX_RETAINED_INPUT_BYTES:
        upload.spool.discard()
        raise CapacityExceeded(
            "Your organization already retains 1 GiB of input files; delete unused input files "
            "or wait for batches to finish.",
            code=ErrorCode.RETAINED_INPUT_LIMIT,
        )
    name = _storage_name(upload.file_id)
    stored = upload.spool.commit(name)
    key_id, wrapped = Keyring.current().wrap(upload.data_key)
    now = clock.now()
    file = File.objects.create(
        id=upload.file_id,
        org=org,
        purpose=File.Purpose.BATCH,
        status=File.Status.PROCESSED,
        filename=f"{upload.file_id}.jsonl",
        bytes=upload.spool.plaintext_size,
        sha256=upload.spool.etag_digest,
        storage_name=name,
        stored_bytes=stored,
        key_id=key_id,
        wrapped_key=wrapped,
        model=report.model or "",
        line_count=len(report.lines),
        format=report.format or "",
        line_index=[
            [li.offset, li.length, li.custom_id, li.max_tokens, li.n]
            + ([li.section_offset, li.section_length] if li.section_offset is not None else [])
            for li in report.lines
        ],
        created_at=now,
        expires_at=now + UNUSED_INPUT_TTL,
    )
    logger.info(
        "file stored id=%s org=%s bytes=%s lines=%s", file.id, org.id, file.bytes, file.line_count
    )
    return file


def file_publish_result(
    *, org: Organization, file_id: str, rows: Iterable[bytes], filename: str
) -> File:
    """Write a result file (purpose batch_output) under a deterministic id.

    Idempotent: a retried finalization finds the row it made before and reuses it, so the
    published file (and its ETag) is the same whatever the number of attempts. Two attempts
    racing each write their own blob; the row that wins names its blob and the loser's is
    removed, so the surviving row always matches the blob it points at.
    """
    existing = File.objects.filter(id=file_id).first()
    if existing is not None:
        return existing
    data_key = new_data_key()
    store = content_store()
    suffix = f"{file_id}.{secrets.token_hex(4)}.enc"
    name, recovery = f"files/{suffix}", f"{RECOVERY_PREFIX}/{suffix}"
    with EncryptedSpool(store, data_key=data_key, aad_prefix=file_id.encode()) as spool:
        for row in rows:
            spool.write(row)
        stored = spool.commit(name)
    try:
        # The recovery copy: the same ciphertext under another prefix, so the same key and
        # ETag serve it when the primary is lost or damaged.
        store.copy(name, recovery)
    except BaseException:
        store.delete(name)
        raise
    key_id, wrapped = Keyring.current().wrap(data_key)
    now = clock.now()
    file, created = File.objects.get_or_create(
        id=file_id,
        defaults={
            "org": org,
            "purpose": File.Purpose.BATCH_OUTPUT,
            "status": File.Status.PROCESSED,
            "filename": filename,
            "bytes": spool.plaintext_size,
            "sha256": spool.etag_digest,
            "storage_name": name,
            "recovery_name": recovery,
            "stored_bytes": stored,
            "key_id": key_id,
            "wrapped_key": wrapped,
            "created_at": now,
            "expires_at": now + RESULT_TTL,
        },
    )
    if not created:
        store.delete(name)
        store.delete(recovery)
    return file


def file_delete(*, file: File) -> None:
    """Destroy the data key first (every copy becomes unreadable), then the blob."""
    if file.status == File.Status.DELETED:
        return
    with transaction.atomic():
        # The row lock orders this delete against a batch acceptance of the same file (which
        # locks it too): one of them sees the other's outcome, never both succeed.
        File.objects.select_for_update().filter(pk=file.pk).first()
        # An input file belongs to its batch until the batch is terminal, when finalization
        # shreds it; so an accepted, undeleted input file is always in use.
        if (
            file.purpose == File.Purpose.BATCH
            and File.objects.filter(pk=file.pk, batch__isnull=False).exists()
        ):
            raise Conflict(
                f"File {file.id} is the input of an unfinished batch; cancel the batch first.",
                code=ErrorCode.FILE_IN_USE,
            )
        file_shred(file=file)


def file_shred(*, file: File) -> bool:
    """Crypto-shred a file: used by delete, expiry and retention sweeps alike.

    The data key goes first, in one compare-and-set (so concurrent shreds agree on who did
    it; True for the one that did), which makes every stored copy unreadable at once. Then
    the blobs go, every copy and every version; `stored_bytes` drops to 0 once they are gone,
    so a blob a failed delete left behind is retried by `file_delete_leftover_blobs`.
    """
    updated = (
        File.objects.filter(pk=file.pk)
        .exclude(status=File.Status.DELETED)
        .update(status=File.Status.DELETED, wrapped_key=None, deleted_at=clock.now())
    )
    if updated:
        logger.info("file deleted id=%s org=%s", file.id, file.org_id)
        try:
            _delete_blobs(file)
        except Exception as exc:
            # The key is gone, so the delete has happened; the sweep removes the blobs.
            logger.warning(
                "file %s: blob deletion failed, the retention sweep retries it: %s",
                file.id,
                exception_trace(exc),
            )
    file.refresh_from_db()
    return bool(updated)


def file_delete_leftover_blobs() -> int:
    """Delete the blobs of shredded files whose blob deletion failed or was cut short.

    Their keys are already destroyed, so the ciphertext is unreadable; this reclaims the
    space and leaves no copy behind. Idempotent; returns how many files it cleaned.
    """
    cleaned = 0
    leftovers = File.objects.filter(status=File.Status.DELETED, stored_bytes__gt=0)
    for file in leftovers.only("id", "storage_name", "recovery_name"):
        try:
            cleaned += _delete_blobs(file)
        except Exception as exc:
            logger.warning("file %s: blob deletion failed again: %s", file.id, exception_trace(exc))
    return cleaned


def _delete_blobs(file: File) -> bool:
    """Delete every copy; True if this call was the one that marked them gone."""
    store = content_store()
    for name in (file.storage_name, file.recovery_name):
        if name:
            store.delete(name)
    return bool(File.objects.filter(pk=file.pk, stored_bytes__gt=0).update(stored_bytes=0))


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


@dataclass
class RewrapCounts:
    rewrapped: int = 0  # wrapped again under the current master key by this call
    current: int = 0  # already under the current master key
    unknown_key: int = 0  # wrapped by a master key that is not configured: left as it is
    damaged: int = 0  # failed authentication under its master key: left as it is

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


REWRAP_PAGE = 500


def data_keys_rewrap(
    *, rows: QuerySet[Any], keyring: Keyring, dry_run: bool = False
) -> RewrapCounts:
    """Re-wrap the data keys of `rows` (a model with key_id and wrapped_key) under the
    keyring's current master key. Content is untouched: the data keys stay the same.

    Each row is a compare-and-set on its old key id with the key still present, so a
    concurrent delete is never undone and concurrent or repeated runs re-wrap each row once.
    """
    counts = RewrapCounts()
    live = rows.filter(wrapped_key__isnull=False)
    counts.current = live.filter(key_id=keyring.current_id).count()
    stale = live.exclude(key_id=keyring.current_id).order_by("pk")
    last_pk: Any = None
    while True:
        page = stale if last_pk is None else stale.filter(pk__gt=last_pk)
        batch = list(page.only("pk", "key_id", "wrapped_key")[:REWRAP_PAGE])
        if not batch:
            return counts
        last_pk = batch[-1].pk
        for row in batch:
            try:
                data_key = keyring.unwrap(row.key_id, row.wrapped_key)
            except UnknownMasterKey:
                counts.unknown_key += 1
                continue
            except TamperedContent:
                counts.damaged += 1
                continue
            if dry_run:
                counts.rewrapped += 1
                continue
            key_id, wrapped = keyring.wrap(data_key)
            counts.rewrapped += (
                type(row)
                .objects.filter(pk=row.pk, key_id=row.key_id, wrapped_key__isnull=False)
                .update(key_id=key_id, wrapped_key=wrapped)
            )
