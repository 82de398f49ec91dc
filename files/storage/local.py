"""The content store on a local directory: blobs staged under `.incoming/`, fsynced as they
stream, renamed into place at commit."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from typing import IO

from django.core.files.storage import FileSystemStorage

from files.storage.base import BlobWriter

_COPY_BUFFER = 1024 * 1024
# While a local blob is written, a background thread flushes it to stable storage every so
# many bytes, so that the disk works as the upload streams rather than all in the final fsync
# (docs/PERFORMANCE.md has the numbers).
_SYNC_EVERY = 16 * 1024 * 1024
_STAGING_DIR = ".incoming"
_fdatasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


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
