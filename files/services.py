"""Writes for files: store an upload, publish a result file, delete, serve ranges."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable, Iterator

from django.db import transaction

from boardwalk import clock
from boardwalk.errors import CapacityExceeded, Conflict, InvalidRequest, PayloadTooLarge
from boardwalk.models import Organization
from files.crypto import Keyring, new_data_key
from files.limits import MAX_INPUT_BYTES, MAX_RETAINED_INPUT_BYTES, RESULT_TTL, UNUSED_INPUT_TTL
from files.models import File
from files.selectors import retained_input_bytes
from files.storage import EncryptedSpool, content_store, open_plaintext_range
from files.upload import ReceivedUpload

logger = logging.getLogger(__name__)


def _storage_name(file_id: str) -> str:
    return f"files/{file_id}.enc"


def file_create_from_upload(*, org: Organization, purpose: str, upload: ReceivedUpload) -> File:
    """Store a validated upload as an input file. The caller already streamed and validated."""
    if upload.too_large:
        raise PayloadTooLarge(
            f"The file is larger than {MAX_INPUT_BYTES // (1024 * 1024)} MiB; split it into "
            "several batches.",
            code="file_too_large",
            param="file",
        )
    report = upload.report
    if report is None:  # the multipart body ended inside the file part
        upload.spool.discard()
        raise InvalidRequest(
            "The upload was incomplete; send the whole file.", code="incomplete_upload"
        )
    if purpose != File.Purpose.BATCH:
        upload.spool.discard()
        raise InvalidRequest(
            "Only purpose 'batch' can be uploaded.", code="invalid_purpose", param="purpose"
        )
    if not report.ok:
        upload.spool.discard()
        shown = len(report.errors)
        more = report.error_count - shown
        message = f"The input file has {report.error_count} error(s)"
        message += f"; the first {shown} are listed in details." if more else "; see details."
        first = report.errors[0]
        message += f" First: line {first.line}: {first.message}"
        raise InvalidRequest(
            message,
            code="invalid_input_file",
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
            code="retained_input_limit",
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
        line_index=[
            [li.offset, li.length, li.custom_id, li.max_tokens, li.n] for li in report.lines
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
    name = f"files/{file_id}.{secrets.token_hex(4)}.enc"
    with EncryptedSpool(store, data_key=data_key, aad_prefix=file_id.encode()) as spool:
        for row in rows:
            spool.write(row)
        stored = spool.commit(name)
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
            "stored_bytes": stored,
            "key_id": key_id,
            "wrapped_key": wrapped,
            "created_at": now,
            "expires_at": now + RESULT_TTL,
        },
    )
    if not created:
        store.delete(name)
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
                code="file_in_use",
            )
        file_shred(file=file)


def file_shred(*, file: File) -> None:
    """Crypto-shred a file: used by delete, expiry and retention sweeps alike."""
    updated = (
        File.objects.filter(pk=file.pk)
        .exclude(status=File.Status.DELETED)
        .update(status=File.Status.DELETED, wrapped_key=None, deleted_at=clock.now())
    )
    if updated:
        content_store().delete(file.storage_name)
        logger.info("file deleted id=%s org=%s", file.id, file.org_id)
    file.refresh_from_db()


def file_read_range(*, file: File, start: int, end: int) -> Iterator[bytes]:
    """Plaintext bytes [start, end] (inclusive), decrypting only the chunks they span."""
    data_key = Keyring.current().unwrap(file.key_id, file.wrapped_key)
    return open_plaintext_range(
        content_store(),
        file.storage_name,
        data_key=data_key,
        aad_prefix=file.aad(),
        plaintext_size=file.bytes,
        start=start,
        end=end,
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
