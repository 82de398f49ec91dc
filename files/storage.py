"""The content store: encrypted blobs by name, on the `content` storage of settings.STORAGES.

Only ciphertext ever reaches the store (see files.crypto). Reads are ranged so that serving a
byte range of a large file fetches only the chunks covering it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import tempfile
import threading
from collections.abc import Iterator
from typing import IO, Any, Protocol

from botocore.exceptions import ClientError
from django.core.exceptions import ImproperlyConfigured
from django.core.files import File as DjangoFile
from django.core.files.storage import FileSystemStorage, Storage, storages
from storages.backends.s3 import S3Storage
from storages.utils import clean_name

from files.crypto import CHUNK_SIZE, ChunkEncryptor, decrypt_range

logger = logging.getLogger(__name__)

_COPY_BUFFER = 1024 * 1024
# While a local blob is written, a background thread flushes it to stable storage every so
# many bytes, so that the disk works as the upload streams rather than all in the final fsync
# (docs/PERFORMANCE.md has the numbers).
_SYNC_EVERY = 16 * 1024 * 1024
# Sealed buffers in flight between an upload's thread and its write-behind thread.
_WRITE_BEHIND_DEPTH = 4
_STAGING_DIR = ".incoming"
_fdatasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


class BlobWriter(Protocol):
    """A blob being written: nothing shows under any name until `commit`."""

    def write(self, data: bytes | bytearray | memoryview) -> None: ...

    def commit(self, name: str) -> int:
        """Make the bytes durable under `name`, replacing any blob; returns the size."""

    def abort(self) -> None:
        """Drop what was written; safe to call more than once, and after `commit`."""


class ContentStore(Protocol):
    def open_writer(self) -> BlobWriter:
        """A new blob to write, streamed to where it will be stored when possible."""

    def save(self, name: str, fileobj: IO[bytes]) -> None:
        """Store the whole of `fileobj` (from its start) under `name`, replacing any blob."""

    def read(self, name: str, offset: int, length: int) -> bytes:
        """Up to `length` bytes from `offset`; fewer only at the end of the blob."""

    def copy(self, source: str, name: str) -> None:
        """Store a byte-identical copy of blob `source` under `name`, replacing any blob."""

    def delete(self, name: str) -> None:
        """Remove the blob, every stored version of it included; a missing one is fine."""

    def exists(self, name: str) -> bool: ...

    def size(self, name: str) -> int:
        """Stored size in bytes; FileNotFoundError if missing."""

    def discard_abandoned(self, before: float) -> int:
        """Remove staged blobs a crashed writer left behind, last written before `before`
        (a Unix time); returns how many. Safe to run from several processes at once."""


class FileSystemContentStore:
    def __init__(self, storage: FileSystemStorage) -> None:
        self.storage = storage

    def open_writer(self) -> BlobWriter:
        # Staged under the content directory itself, so that commit is a rename on the same
        # file system: the bytes are written once. What a crash leaves here is never named.
        staging = os.path.join(self.storage.location, _STAGING_DIR)
        self._make_directory(staging)
        return _LocalBlobWriter(self, staging)

    def save(self, name: str, fileobj: IO[bytes]) -> None:
        writer = self.open_writer()
        try:
            fileobj.seek(0)
            while chunk := fileobj.read(_COPY_BUFFER):
                writer.write(chunk)
            writer.commit(name)
        finally:
            writer.abort()

    def read(self, name: str, offset: int, length: int) -> bytes:
        with open(self.storage.path(name), "rb") as blob:
            blob.seek(offset)
            return blob.read(length)

    def copy(self, source: str, name: str) -> None:
        with open(self.storage.path(source), "rb") as blob:
            self.save(name, blob)

    def delete(self, name: str) -> None:
        self.storage.delete(name)

    def exists(self, name: str) -> bool:
        return self.storage.exists(name)

    def size(self, name: str) -> int:
        return self.storage.size(name)

    def discard_abandoned(self, before: float) -> int:
        staging = os.path.join(self.storage.location, _STAGING_DIR)
        removed = 0
        with contextlib.suppress(FileNotFoundError), os.scandir(staging) as entries:
            for entry in entries:
                if not entry.name.startswith("blob-"):
                    continue
                # Another sweeper may remove the same blob between the listing and here.
                with contextlib.suppress(FileNotFoundError):
                    if entry.stat().st_mtime < before:
                        os.unlink(entry.path)
                        removed += 1
        return removed

    def _make_directory(self, directory: str) -> None:
        missing = []
        path = directory
        while path and not os.path.isdir(path):
            missing.append(path)
            path = os.path.dirname(path)
        if missing:
            os.makedirs(directory, exist_ok=True)
            # Every level created here, not only the leaf: content dirs are private (0700).
            if self.storage.directory_permissions_mode is not None:
                for created in missing:
                    os.chmod(created, self.storage.directory_permissions_mode)


class _LocalBlobWriter:
    def __init__(self, store: FileSystemContentStore, staging: str) -> None:
        self._store = store
        fd, path = tempfile.mkstemp(dir=staging, prefix="blob-")
        self._fd: int | None = fd
        self._path: str | None = path  # None once renamed into place or removed
        self._size = 0
        self._flush_asked_at = 0  # bytes written when a background flush was last asked for
        self._syncer: _BackgroundSync | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        fd, _ = self._staged()
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
            self._size += written
        if self._size - self._flush_asked_at >= _SYNC_EVERY:
            self._flush_in_background(fd)

    def commit(self, name: str) -> int:
        fd, staged = self._staged()
        path = self._store.storage.path(name)  # refuses names outside the directory
        directory = os.path.dirname(path)
        self._store._make_directory(directory)
        syncer, self._syncer = self._syncer, None
        if syncer is not None:
            syncer.stop()
        try:
            # Durable before the row that points at it commits. A background flush may be
            # under way: this one waits for it and for whatever came after.
            os.fsync(fd)
        finally:
            if syncer is not None:
                syncer.join()
        if syncer is not None and syncer.error is not None:
            raise syncer.error
        self._fd = None
        os.close(fd)
        if self._store.storage.file_permissions_mode is not None:
            os.chmod(staged, self._store.storage.file_permissions_mode)
        os.replace(staged, path)
        self._path = None
        _fsync_directory(directory)
        return self._size

    def abort(self) -> None:
        if self._syncer is not None:
            # Joined before the descriptor closes: its number could be reused meanwhile.
            self._syncer.stop()
            self._syncer.join()
            self._syncer = None
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
        if self._path is not None:
            path, self._path = self._path, None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _staged(self) -> tuple[int, str]:
        if self._fd is None or self._path is None:
            raise ValueError("blob writer already committed or aborted")
        return self._fd, self._path

    def _flush_in_background(self, fd: int) -> None:
        self._flush_asked_at = self._size
        if self._syncer is None:
            self._syncer = _BackgroundSync(fd)
        error = self._syncer.error
        if error is not None:
            raise error
        self._syncer.request()


class _BackgroundSync:
    """Flushes a file to stable storage from a thread, on request, while it is written.

    The final fsync then has little left to do. A flush error is kept for the writer to
    raise: once reported to one fsync, the kernel does not report it to the next.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._condition = threading.Condition()
        self._requested = False
        self._stopping = False
        self.error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="blob-sync", daemon=True)
        self._thread.start()

    def request(self) -> None:
        with self._condition:
            self._requested = True
            self._condition.notify()

    def stop(self) -> None:
        with self._condition:
            self._stopping = True
            self._condition.notify()

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._condition:
                while not (self._requested or self._stopping):
                    self._condition.wait()
                if self._stopping:
                    return
                self._requested = False
            try:
                _fdatasync(self._fd)
            except OSError as exc:
                self.error = exc
                return


def _fsync_directory(directory: str) -> None:
    """Make a rename into `directory` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _TemporaryBlobWriter:
    """For stores that take a whole object (S3): spool to a temporary file, then upload it."""

    def __init__(self, store: ContentStore) -> None:
        self._store = store
        self._tmp: IO[bytes] | None = tempfile.TemporaryFile()  # noqa: SIM115

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._tmp is None:
            raise ValueError("blob writer already committed or aborted")
        self._tmp.write(data)

    def commit(self, name: str) -> int:
        if self._tmp is None:
            raise ValueError("blob writer already committed or aborted")
        size = self._tmp.tell()
        self._tmp.flush()
        self._store.save(name, self._tmp)
        self.abort()
        return size

    def abort(self) -> None:
        if self._tmp is not None:
            self._tmp.close()
            self._tmp = None


class S3ContentStore:
    def __init__(self, storage: S3Storage) -> None:
        if not storage.file_overwrite:
            raise ImproperlyConfigured("the S3 content storage needs file_overwrite=True")
        if storage.gzip:
            # Compressed objects would break ranged reads by stored offset.
            raise ImproperlyConfigured("the S3 content storage must not gzip (gzip=False)")
        self.storage = storage

    def open_writer(self) -> BlobWriter:
        return _TemporaryBlobWriter(self)

    def save(self, name: str, fileobj: IO[bytes]) -> None:
        fileobj.seek(0)
        saved = self.storage.save(name, DjangoFile(fileobj, name))
        if saved != name:
            raise RuntimeError(f"S3 storage saved {name!r} as {saved!r}")

    def read(self, name: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        # A ranged GET: S3File (storage.open) would download the whole object first.
        key = self._key(name)
        client = self.storage.connection.meta.client
        try:
            response = client.get_object(
                Bucket=self.storage.bucket_name,
                Key=key,
                Range=f"bytes={offset}-{offset + length - 1}",
            )
        except client.exceptions.NoSuchKey:
            raise FileNotFoundError(f"no stored blob {name!r}") from None
        except ClientError as err:
            # Past the end: S3 answers 416 rather than an empty body.
            if err.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""
            raise
        with contextlib.closing(response["Body"]) as body:
            return body.read()

    def copy(self, source: str, name: str) -> None:
        # Server-side: the bytes never come back through this process.
        client = self.storage.connection.meta.client
        try:
            client.copy(
                {"Bucket": self.storage.bucket_name, "Key": self._key(source)},
                self.storage.bucket_name,
                self._key(name),
                Config=self.storage.transfer_config,
            )
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                raise FileNotFoundError(f"no stored blob {source!r}") from None
            raise

    def delete(self, name: str) -> None:
        """Delete every version of the key and its delete markers, not just the latest.

        On a versioned bucket a plain DELETE only hides the object behind a delete marker:
        the ciphertext would stay stored. Needs s3:ListBucketVersions and
        s3:DeleteObjectVersion; without them only the current version goes (logged).
        """
        key = self._key(name)
        client = self.storage.connection.meta.client
        bucket = self.storage.bucket_name
        try:
            versions = self._versions(client, key)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") != "AccessDenied":
                raise
            logger.warning(
                "no permission to list object versions in bucket %s: deleting only the "
                "current version of %s",
                bucket,
                key,
            )
            client.delete_object(Bucket=bucket, Key=key)
            return
        if not versions:
            client.delete_object(Bucket=bucket, Key=key)
            return
        for start in range(0, len(versions), 1000):  # DeleteObjects takes 1,000 at most
            batch = versions[start : start + 1000]
            response = client.delete_objects(
                Bucket=bucket,
                Delete={
                    "Objects": [{"Key": key, "VersionId": version} for version in batch],
                    "Quiet": True,
                },
            )
            errors = response.get("Errors") or []
            if errors:
                first = errors[0]
                raise OSError(
                    f"S3 refused to delete {len(errors)} version(s) of {key}: "
                    f"{first.get('Code')} {first.get('Message')}"
                )

    def _versions(self, client: Any, key: str) -> list[str]:
        """Version ids of `key` itself (not of keys it prefixes), delete markers included."""
        versions: list[str] = []
        paginator = client.get_paginator("list_object_versions")
        for page in paginator.paginate(Bucket=self.storage.bucket_name, Prefix=key):
            for entry in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
                if entry["Key"] == key:
                    versions.append(entry["VersionId"])
        return versions

    def exists(self, name: str) -> bool:
        return self.storage.exists(name)

    def size(self, name: str) -> int:
        return self.storage.size(name)

    def discard_abandoned(self, before: float) -> int:
        return 0  # S3 writers stage in local temporary files, which die with their process

    def _key(self, name: str) -> str:
        return self.storage._normalize_name(clean_name(name))


def content_store() -> ContentStore:
    """The store over the current settings.STORAGES["content"]."""
    storage: Storage = storages["content"]
    if isinstance(storage, FileSystemStorage):
        return FileSystemContentStore(storage)
    if isinstance(storage, S3Storage):
        return S3ContentStore(storage)
    raise ImproperlyConfigured(
        f"STORAGES['content'] must be a FileSystemStorage or S3Storage, not {type(storage)}"
    )


class _WriteBehind:
    """Writes sealed buffers to a blob from a thread, in order, while the caller seals more.

    `os.write` (and an S3 spool's file write) releases the GIL, so the disk's share of an
    upload overlaps the validation and encryption of the next reads instead of adding to
    them. A few buffers circulate between the two threads: the caller blocks for a free one
    only when the disk is the slower side, so memory stays bounded by `depth` buffers.
    """

    def __init__(self, writer: BlobWriter, *, depth: int = _WRITE_BEHIND_DEPTH) -> None:
        self._writer = writer
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(depth):
            self._free.put(bytearray())
        self._pending: queue.SimpleQueue[tuple[bytearray, memoryview] | None] = queue.SimpleQueue()
        self._cancelled = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="blob-write", daemon=True)
        self._thread.start()

    def free_buffer(self) -> bytearray:
        """A buffer no write is using (waits for one); raises what an earlier write raised."""
        buffer = self._free.get()
        self._raise_error()
        return buffer

    def submit(self, buffer: bytearray, sealed: memoryview) -> None:
        """Queue `sealed` (a view of `buffer`) for writing; `buffer` comes back once written."""
        if sealed:
            self._pending.put((buffer, sealed))
        else:
            self._free.put(buffer)

    def close(self) -> None:
        """Wait until everything submitted is written; raises what a write raised."""
        self._pending.put(None)
        self._thread.join()
        self._raise_error()

    def cancel(self) -> None:
        """Stop without writing what is still queued; the writer is free once this returns."""
        self._cancelled = True
        self._pending.put(None)
        self._thread.join()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (item := self._pending.get()) is not None:
            buffer, sealed = item
            if self._error is None and not self._cancelled:
                try:
                    self._writer.write(sealed)
                except BaseException as exc:  # handed to the caller's next call
                    self._error = exc
            self._free.put(buffer)


class EncryptedSpool:
    """Encrypts a stream straight into a new blob of the content store, named at `commit`.

    Memory stays bounded by one chunk; the plaintext never touches the disk. The plaintext
    size and the strong ETag digest (`etag_digest`) are computed on the way.
    """

    def __init__(self, store: ContentStore, *, data_key: bytes, aad_prefix: bytes) -> None:
        self._encryptor = ChunkEncryptor(data_key, aad_prefix)
        self._writer: BlobWriter | None = store.open_writer()
        self._behind: _WriteBehind | None = None  # started by the first completed chunk
        self.stored_size = 0

    def write(self, plaintext: bytes) -> None:
        writer = self._open_writer()
        if self._behind is None:
            if self._encryptor.buffered + len(plaintext) < CHUNK_SIZE:
                self._encryptor.update_reusing(plaintext)  # completes no chunk: buffered only
                return
            self._behind = _WriteBehind(writer)
        buffer, sealed = self._encryptor.update_into(plaintext, self._behind.free_buffer())
        self._behind.submit(buffer, sealed)

    @property
    def plaintext_size(self) -> int:
        return self._encryptor.plaintext_size

    @property
    def etag_digest(self) -> str:
        """The File.sha256 of the stored blob (see ChunkEncryptor.tags_digest); after commit."""
        return self._encryptor.tags_digest()

    def commit(self, name: str) -> int:
        """Seal the last chunk, store the blob durably as `name` and return its stored size."""
        writer = self._open_writer()
        try:
            if self._behind is not None:
                behind, self._behind = self._behind, None
                behind.close()  # every sealed chunk written, in order; raises what a write raised
            writer.write(self._encryptor.finalize())
            self.stored_size = writer.commit(name)
        finally:
            self.discard()
        return self.stored_size

    def discard(self) -> None:
        """Drop the blob unless committed; safe to call more than once."""
        if self._behind is not None:
            behind, self._behind = self._behind, None
            behind.cancel()  # the thread is done with the writer before it is aborted
        if self._writer is not None:
            self._writer.abort()
            self._writer = None

    def _open_writer(self) -> BlobWriter:
        if self._writer is None:
            raise ValueError("EncryptedSpool already stored or discarded")
        return self._writer

    def __enter__(self) -> EncryptedSpool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.discard()


def open_plaintext_range(
    store: ContentStore,
    name: str,
    *,
    data_key: bytes,
    aad_prefix: bytes,
    plaintext_size: int,
    start: int,
    end: int,
) -> Iterator[bytes]:
    """Plaintext bytes [start, end] (inclusive) of a stored blob, verified chunk by chunk."""

    def read(offset: int, length: int) -> bytes:
        return store.read(name, offset, length)

    return decrypt_range(
        read,
        data_key=data_key,
        aad_prefix=aad_prefix,
        plaintext_size=plaintext_size,
        start=start,
        end=end,
    )
