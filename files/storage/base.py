"""What a content store offers: blobs by name, written once, read by range."""

from __future__ import annotations

from typing import IO, Protocol


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
