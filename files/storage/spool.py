"""An upload's plaintext, encrypted in chunks and written behind the request's thread into a
blob of the content store; and the plaintext of a stored range, decrypted."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

from files.crypto import CHUNK_SIZE, ChunkEncryptor, decrypt_range
from files.storage.base import BlobWriter, ContentStore

# Sealed buffers in flight between an upload's thread and its write-behind thread.
_WRITE_BEHIND_DEPTH = 4


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
