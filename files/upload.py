"""Receiving an upload: the multipart body of POST /v1/files, validated and encrypted as it streams.

`upload_receive` reads the body with files.multipart and feeds the `file` part to the line
validator and to the encrypting spool, which writes straight into the content store; memory
stays bounded whatever the upload's size and the plaintext never touches the disk. Storing
the File row is `files.services.writes.file_create_from_upload`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.files.uploadhandler import FileUploadHandler, SkipFile

from boardwalk.codes import ErrorCode
from boardwalk.errors import InvalidRequest, PayloadTooLarge
from boardwalk.ids import new_id
from files.crypto import new_data_key
from files.limits import MAX_INPUT_BYTES, MAX_INPUT_LINES, MAX_LINE_BYTES, MiB
from files.multipart import IncompleteBody, MultipartError, MultipartReader
from files.storage import EncryptedSpool, content_store
from files.validation import InputValidator, Resolver, ValidationReport

FILE_FIELD = "file"
TEXT_FIELDS = frozenset({"purpose"})
MAX_TEXT_FIELD_BYTES = 64 * 1024
# A form has two fields; a few extra ones are named back in the error, not thousands.
MAX_PARTS = 16
# Room for the boundaries, part headers and small fields around a file at the size limit.
MULTIPART_OVERHEAD = 1 * MiB


@dataclass
class ReceivedUpload:
    """What came of the `file` part; the service turns it into a File row."""

    file_id: str
    data_key: bytes
    spool: EncryptedSpool
    validator: InputValidator
    size: int = 0
    too_large: bool = False
    report: ValidationReport | None = None

    def feed(self, data: bytes) -> None:
        if self.too_large:
            return
        self.size += len(data)
        if self.size > MAX_INPUT_BYTES:
            # The rest is only read past: there is nothing worth validating or keeping.
            self.too_large = True
            self.spool.discard()
            return
        self.validator.feed(data)
        self.spool.write(data)

    def finish(self) -> None:
        if not self.too_large:
            self.report = self.validator.finish()


@dataclass
class ReceivedForm:
    """The fields of an upload form. `unexpected` names every other field, and repeats."""

    upload: ReceivedUpload | None = None
    text: dict[str, str] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)

    def discard(self) -> None:
        """Drop the spooled file unless stored; safe to call more than once."""
        if self.upload is not None:
            self.upload.spool.discard()


def upload_receive(
    read: Callable[[int], bytes],
    *,
    boundary: bytes,
    content_length: int | None,
    resolver: Resolver,
) -> ReceivedForm:
    """Read a multipart upload form from `read(n)`, streaming its `file` part to storage.

    Raises PayloadTooLarge when the declared body cannot fit the size limit (before reading
    anything), InvalidRequest for a malformed or incomplete body; either way nothing is kept.
    A file over the limit found while streaming is left for file_create_from_upload to
    refuse (`upload.too_large`). The caller discards the form unless it stores the file.
    """
    if content_length is not None and content_length > MAX_INPUT_BYTES + MULTIPART_OVERHEAD:
        raise _too_large()
    received = 0

    def counted_read(size: int) -> bytes:
        nonlocal received
        data = read(size)
        received += len(data)
        return data

    reader = MultipartReader(counted_read, boundary)
    form = ReceivedForm()
    parts = 0
    try:
        while (part := reader.next_part()) is not None:
            parts += 1
            if parts > MAX_PARTS:
                raise MultipartError(f"The form has more than {MAX_PARTS} fields.")
            if part.name == FILE_FIELD and form.upload is None:
                form.upload = upload = _new_upload(resolver)
                for chunk in reader.chunks():
                    upload.feed(chunk)
                upload.finish()
            elif part.name in TEXT_FIELDS and part.name not in form.text:
                value = reader.read_value(MAX_TEXT_FIELD_BYTES)
                try:
                    form.text[part.name] = value.decode("utf-8")
                except UnicodeDecodeError:
                    raise MultipartError(f"The field {part.name!r} is not valid UTF-8.") from None
            else:
                form.unexpected.append(part.name)
                reader.skip()
        reader.drain()
        if content_length is not None and received < content_length:
            # The framing closed, but the client promised more: the body was cut short.
            raise IncompleteBody("The body is shorter than its Content-Length.")
    except IncompleteBody:
        form.discard()
        raise InvalidRequest(
            "The upload was incomplete; send the whole file.", code=ErrorCode.INCOMPLETE_UPLOAD
        ) from None
    except MultipartError as exc:
        form.discard()
        raise InvalidRequest(
            f"The request body is not valid multipart/form-data: {exc}",
            code=ErrorCode.INVALID_MULTIPART,
        ) from None
    except BaseException:
        form.discard()
        raise
    return form


def _new_upload(resolver: Resolver) -> ReceivedUpload:
    file_id = new_id("file-")
    data_key = new_data_key()
    return ReceivedUpload(
        file_id=file_id,
        data_key=data_key,
        spool=EncryptedSpool(content_store(), data_key=data_key, aad_prefix=file_id.encode()),
        validator=InputValidator(
            resolver, max_lines=MAX_INPUT_LINES, max_line_bytes=MAX_LINE_BYTES
        ),
    )


def _too_large() -> PayloadTooLarge:
    # Worded as file_create_from_upload words the same refusal found while streaming.
    return PayloadTooLarge(
        f"The file is larger than {MAX_INPUT_BYTES // MiB} MiB; split it into several batches.",
        code=ErrorCode.FILE_TOO_LARGE,
        param="file",
    )


class RefuseFileUploads(FileUploadHandler):
    """The only entry of settings.FILE_UPLOAD_HANDLERS: Django's parser keeps no file at all.

    POST /v1/files reads its body with `upload_receive`; this makes sure no other view ever
    spools an upload to memory or disk in plaintext.
    """

    def new_file(self, *args: Any, **kwargs: Any) -> None:
        raise SkipFile()

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        return None

    def file_complete(self, file_size: int) -> None:
        return None


# The name settings.FILE_UPLOAD_HANDLERS still uses.
