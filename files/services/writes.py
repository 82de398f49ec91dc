"""Writes for files: store an upload, publish a result file, delete and shred.

Every change to a File row or its stored blobs is here: `file_create_from_upload` (an input
file, after files.upload streamed and validated it), `file_publish_result` (a batch's output
or error file, idempotent, with its recovery copy), `file_delete` (the API's delete) and
`file_shred` (the data key first, then every copy: docs/ARCHITECTURE.md decision 6), used by
delete, finalization and the retention sweeps, whose leftovers `file_delete_leftover_blobs`
retries.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable

from django.db import transaction

from boardwalk import clock
from boardwalk.codes import ErrorCode
from boardwalk.errors import CapacityExceeded, Conflict, InvalidRequest, PayloadTooLarge
from boardwalk.logs import exception_trace
from boardwalk.models import Organization
from files.crypto import Keyring, new_data_key
from files.limits import MAX_INPUT_BYTES, MAX_RETAINED_INPUT_BYTES, RESULT_TTL, UNUSED_INPUT_TTL
from files.models import File
from files.selectors import retained_input_bytes
from files.storage import EncryptedSpool, content_store
from files.upload import ReceivedUpload

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
