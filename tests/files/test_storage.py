"""The content store on both backends: a local directory and a real S3-compatible endpoint."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from pytest_django import Settings

from files.crypto import (
    CHUNK_SIZE,
    STORED_CHUNK_SIZE,
    TAG_SIZE,
    TamperedContent,
    encrypted_size,
    new_data_key,
)
from files.storage import (
    ContentStore,
    EncryptedSpool,
    FileSystemContentStore,
    S3ContentStore,
    content_store,
    open_plaintext_range,
)
from files.storage import local as storage_local
from files.storage import spool as storage_spool
from tests.files.conftest import Backend, use_local_content

if TYPE_CHECKING:
    from tests.files.conftest import S3Endpoint

MARKER = b"PLAINTEXT-MARKER-do-not-store"


def spool_into(
    store: ContentStore, name: str, pieces: list[bytes], *, data_key: bytes, aad: bytes
) -> EncryptedSpool:
    spool = EncryptedSpool(store, data_key=data_key, aad_prefix=aad)
    for piece in pieces:
        spool.write(piece)
    spool.commit(name)
    return spool


def tags_digest(stored: bytes) -> str:
    """SHA-256 over the tag that ends each stored chunk, the final short chunk included."""
    tags = b"".join(
        stored[start : start + STORED_CHUNK_SIZE][-TAG_SIZE:]
        for start in range(0, len(stored), STORED_CHUNK_SIZE)
    )
    return hashlib.sha256(tags).hexdigest()


def read_plain(
    store: ContentStore, name: str, key: bytes, size: int, start: int, end: int
) -> bytes:
    pieces = open_plaintext_range(
        store, name, data_key=key, aad_prefix=b"file-1", plaintext_size=size, start=start, end=end
    )
    return b"".join(pieces)


def test_save_read_size_exists_delete(backend: Backend) -> None:
    store = backend.store
    data = bytes(range(256)) * 40
    assert not store.exists("ab/blob")

    store.save("ab/blob", io.BytesIO(data))

    assert store.exists("ab/blob")
    assert store.size("ab/blob") == len(data)
    assert store.read("ab/blob", 0, 10) == data[:10]
    assert store.read("ab/blob", 1000, 333) == data[1000:1333]
    assert store.read("ab/blob", len(data) - 5, 100) == data[-5:]
    assert store.read("ab/blob", len(data), 10) == b""
    assert store.read("ab/blob", 7, 0) == b""
    assert backend.keys() == ["ab/blob"]

    store.delete("ab/blob")
    assert not store.exists("ab/blob")
    assert backend.keys() == []
    store.delete("ab/blob")  # already gone: fine


def test_save_reads_the_file_from_its_start(backend: Backend) -> None:
    fileobj = io.BytesIO(b"0123456789")
    fileobj.seek(5)
    backend.store.save("blob", fileobj)
    assert backend.raw("blob") == b"0123456789"


def test_save_replaces_a_blob_of_the_same_name(backend: Backend) -> None:
    backend.store.save("blob", io.BytesIO(b"first version, longer"))
    backend.store.save("blob", io.BytesIO(b"second"))
    assert backend.raw("blob") == b"second"
    assert backend.store.size("blob") == len(b"second")
    # No renamed copy (Storage.save's default) and no temporary file left behind.
    assert backend.keys() == ["blob"]


def test_missing_blob(backend: Backend) -> None:
    with pytest.raises(FileNotFoundError):
        backend.store.size("nope")
    with pytest.raises(FileNotFoundError):
        backend.store.read("nope", 0, 10)


def test_encrypted_spool_roundtrip_through_the_store(backend: Backend) -> None:
    lines = [MARKER + b" line %d\n" % i for i in range(30_000)]
    plaintext = b"".join(lines)
    key = new_data_key()

    spool = EncryptedSpool(backend.store, data_key=key, aad_prefix=b"file-1")
    for line in lines:
        spool.write(line)
    stored = spool.commit("files/file-1")

    size = len(plaintext)
    assert size > 10 * CHUNK_SIZE
    assert spool.plaintext_size == size
    assert spool.etag_digest == tags_digest(backend.raw("files/file-1"))
    assert stored == encrypted_size(size) == backend.store.size("files/file-1")
    raw = backend.raw("files/file-1")
    assert MARKER not in raw
    assert b"line 1\n" not in raw

    store = backend.store
    assert read_plain(store, "files/file-1", key, size, 0, size - 1) == plaintext
    for start, end in [(0, 0), (CHUNK_SIZE - 3, CHUNK_SIZE + 3), (size - 100, size - 1)]:
        assert (
            read_plain(store, "files/file-1", key, size, start, end) == plaintext[start : end + 1]
        )


def test_spool_larger_than_a_multipart_part(backend: Backend) -> None:
    # Over 8 MiB: S3 uploads it in several parts.
    plaintext = os.urandom(9 * 1024 * 1024 + 123)
    key = new_data_key()
    spool_into(backend.store, "big", [plaintext], data_key=key, aad=b"file-1")
    size = len(plaintext)
    assert read_plain(backend.store, "big", key, size, 0, size - 1) == plaintext
    start = 5 * 1024 * 1024 + 17
    assert read_plain(backend.store, "big", key, size, start, size - 2) == plaintext[start:-1]


def test_empty_file_roundtrip(backend: Backend) -> None:
    key = new_data_key()
    spool = spool_into(backend.store, "empty", [], data_key=key, aad=b"file-1")
    assert spool.stored_size == encrypted_size(0) == backend.store.size("empty")
    assert spool.etag_digest == tags_digest(backend.raw("empty"))
    assert read_plain(backend.store, "empty", key, 0, 0, -1) == b""


def test_tampered_blob_in_the_store_is_detected(backend: Backend) -> None:
    key = new_data_key()
    plaintext = os.urandom(3 * CHUNK_SIZE)
    spool_into(backend.store, "blob", [plaintext], data_key=key, aad=b"file-1")
    raw = bytearray(backend.raw("blob"))
    raw[CHUNK_SIZE + 100] ^= 0x01
    backend.store.save("blob", io.BytesIO(bytes(raw)))

    assert read_plain(backend.store, "blob", key, len(plaintext), 0, 99) == plaintext[:100]
    with pytest.raises(TamperedContent):
        read_plain(backend.store, "blob", key, len(plaintext), 0, len(plaintext) - 1)


def test_discarded_spool_stores_nothing(backend: Backend) -> None:
    spool = EncryptedSpool(backend.store, data_key=new_data_key(), aad_prefix=b"file-1")
    spool.write(MARKER)
    spool.discard()
    spool.discard()
    with pytest.raises(ValueError):
        spool.write(b"more")
    with pytest.raises(ValueError):
        spool.commit("blob")
    assert backend.keys() == []


def test_local_blob_permissions_and_no_temporary_files(settings: Settings, tmp_path: Path) -> None:
    use_local_content(settings, tmp_path / "content")
    store = content_store()
    store.save("ab/cd/blob", io.BytesIO(b"x" * 10))
    blob = tmp_path / "content" / "ab" / "cd" / "blob"
    assert stat.S_IMODE(blob.stat().st_mode) == 0o600
    assert [p.name for p in blob.parent.iterdir()] == ["blob"]


def test_local_names_cannot_escape_the_content_directory(
    settings: Settings, tmp_path: Path
) -> None:
    use_local_content(settings, tmp_path / "content")
    with pytest.raises(Exception, match="outside"):
        content_store().save("../escaped", io.BytesIO(b"x"))
    assert not (tmp_path / "escaped").exists()


def test_writer_shows_nothing_until_commit(backend: Backend) -> None:
    store = backend.store
    writer = store.open_writer()
    writer.write(b"first ")
    writer.write(memoryview(b"second"))
    assert not store.exists("ab/blob")
    assert writer.commit("ab/blob") == len(b"first second")
    assert backend.raw("ab/blob") == b"first second"
    assert backend.keys() == ["ab/blob"]
    writer.abort()  # after commit: nothing to do
    assert backend.keys() == ["ab/blob"]
    with pytest.raises(ValueError):
        writer.write(b"more")


def test_aborted_writer_leaves_nothing(backend: Backend, tmp_path: Path) -> None:
    writer = backend.store.open_writer()
    writer.write(MARKER)
    writer.abort()
    writer.abort()
    with pytest.raises(ValueError):
        writer.commit("blob")
    assert backend.keys() == []
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_local_writer_flushes_in_the_background_while_writing(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_local_content(settings, tmp_path / "content")
    monkeypatch.setattr("files.storage.local._SYNC_EVERY", 3000)
    flushes: list[int] = []
    real_fdatasync = storage_local._fdatasync

    def fdatasync(fd: int) -> None:
        flushes.append(fd)
        real_fdatasync(fd)

    monkeypatch.setattr("files.storage.local._fdatasync", fdatasync)
    data = os.urandom(10_000)
    writer = content_store().open_writer()
    writer.write(data[:2999])
    time.sleep(0.05)
    assert flushes == []  # none asked for below _SYNC_EVERY
    for start in range(2999, len(data), 500):
        writer.write(data[start : start + 500])
    wait_for(lambda: flushes)  # in the background, before any commit
    assert writer.commit("files/blob") == len(data)

    assert (tmp_path / "content" / "files" / "blob").read_bytes() == data
    assert 1 <= len(flushes) <= 3  # asked for at ~3000, ~6000 and ~9000 bytes
    assert [p.name for p in (tmp_path / "content").rglob("*") if p.is_file()] == ["blob"]


def wait_for(condition: Callable[[], object], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_background_flush_failure_fails_the_commit_and_keeps_nothing(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_local_content(settings, tmp_path / "content")
    monkeypatch.setattr("files.storage.local._SYNC_EVERY", 100)

    failed = threading.Event()

    def broken(fd: int) -> None:
        failed.set()
        raise OSError(errno.EIO, "device gone")

    monkeypatch.setattr("files.storage.local._fdatasync", broken)
    spool = EncryptedSpool(content_store(), data_key=new_data_key(), aad_prefix=b"file-1")
    with pytest.raises(OSError, match="device gone"), spool:
        for _ in range(100):
            spool.write(b"x" * 1000)
        assert failed.wait(10)
        spool.commit("files/blob")
    assert [p for p in (tmp_path / "content").rglob("*") if p.is_file()] == []


def test_s3_read_is_a_ranged_get_under_the_location_prefix(
    settings: Settings, s3_endpoint: S3Endpoint
) -> None:
    location = f"t-{uuid.uuid4().hex}"
    s3_endpoint.use_for_content(settings, location=location)
    store = content_store()
    assert isinstance(store, S3ContentStore)
    data = os.urandom(100_000)
    store.save("ab/blob", io.BytesIO(data))

    listing = s3_endpoint.client().list_objects_v2(Bucket=s3_endpoint.bucket, Prefix=location)
    assert [item["Key"] for item in listing["Contents"]] == [f"{location}/ab/blob"]

    requested: list[dict[str, Any]] = []

    def record(params: dict[str, Any], **kwargs: Any) -> None:
        requested.append(dict(params))

    events = store.storage.connection.meta.client.meta.events
    events.register("provide-client-params.s3.GetObject", record)
    try:
        assert store.read("ab/blob", 5000, 1234) == data[5000:6234]
    finally:
        events.unregister("provide-client-params.s3.GetObject", record)
    assert requested == [
        {"Bucket": s3_endpoint.bucket, "Key": f"{location}/ab/blob", "Range": "bytes=5000-6233"}
    ]


def test_content_store_follows_the_storages_setting(
    settings: Settings, tmp_path: Path, s3_endpoint: S3Endpoint
) -> None:
    use_local_content(settings, tmp_path)
    assert isinstance(content_store(), FileSystemContentStore)
    s3_endpoint.use_for_content(settings)
    assert isinstance(content_store(), S3ContentStore)
    settings.STORAGES = {
        **settings.STORAGES,
        "content": {"BACKEND": "django.core.files.storage.InMemoryStorage"},
    }
    with pytest.raises(ImproperlyConfigured):
        content_store()


def test_s3_store_refuses_options_that_break_it(
    settings: Settings, s3_endpoint: S3Endpoint
) -> None:
    for extra in [{"file_overwrite": False}, {"gzip": True}]:
        options = {**s3_endpoint.storage_options(), **extra}
        settings.STORAGES = {
            **settings.STORAGES,
            "content": {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": options},
        }
        with pytest.raises(ImproperlyConfigured):
            content_store()


def test_copy_is_byte_identical_also_past_a_multipart_part(backend: Backend) -> None:
    data = os.urandom(9 * 1024 * 1024 + 5)  # S3 copies it part by part
    backend.store.save("files/blob", io.BytesIO(data))
    backend.store.copy("files/blob", "recovery/blob")
    assert backend.raw("recovery/blob") == data
    assert backend.keys() == ["files/blob", "recovery/blob"]
    backend.store.copy("files/blob", "recovery/blob")  # again: replaced, not duplicated
    assert backend.keys() == ["files/blob", "recovery/blob"]
    with pytest.raises(FileNotFoundError):
        backend.store.copy("files/missing", "recovery/missing")
    assert backend.keys() == ["files/blob", "recovery/blob"]


class _FaultyWriter:
    """A real blob writer whose writes wait on `gate` and fail once `fail_after` bytes passed."""

    def __init__(self, writer: Any, *, fail_after: int | None = None) -> None:
        self._writer = writer
        self._fail_after = fail_after
        self.gate = threading.Event()
        self.gate.set()
        self.writes = 0
        self.written = 0
        self.aborted = False
        self.written_after_abort = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert self.gate.wait(10)
        self.written_after_abort |= self.aborted
        if self._fail_after is not None and self.written + len(data) > self._fail_after:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.writes += 1
        self.written += len(data)
        self._writer.write(data)

    def commit(self, name: str) -> int:
        return int(self._writer.commit(name))

    def abort(self) -> None:
        self.aborted = True
        self._writer.abort()


def faulty_store(monkeypatch: pytest.MonkeyPatch, **faults: Any) -> tuple[ContentStore, list]:
    store = content_store()
    opened: list[_FaultyWriter] = []
    real_open = store.open_writer

    def open_writer() -> _FaultyWriter:
        opened.append(_FaultyWriter(real_open(), **faults))
        return opened[-1]

    monkeypatch.setattr(store, "open_writer", open_writer)
    return store, opened


def test_a_write_that_fails_behind_the_spool_fails_it_and_keeps_nothing(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_local_content(settings, tmp_path / "content")
    store, opened = faulty_store(monkeypatch, fail_after=3 * STORED_CHUNK_SIZE)
    spool = EncryptedSpool(store, data_key=new_data_key(), aad_prefix=b"file-1")
    with pytest.raises(OSError, match="No space left"), spool:
        for _ in range(64):  # the error comes back on a later write, or at the latest on commit
            spool.write(os.urandom(CHUNK_SIZE))
        spool.commit("files/blob")
    assert opened[0].aborted
    assert [p for p in (tmp_path / "content").rglob("*") if p.is_file()] == []


def test_sealed_chunks_written_behind_arrive_whole_and_in_order(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_local_content(settings, tmp_path / "content")
    store, opened = faulty_store(monkeypatch)
    key = new_data_key()
    pieces = [os.urandom(size) for size in (10, CHUNK_SIZE, 3 * CHUNK_SIZE + 7, 1, 200_000)] * 20
    spool_into(store, "files/blob", pieces, data_key=key, aad=b"file-1")
    plaintext = b"".join(pieces)
    assert opened[0].writes > 20  # written piece by piece from the thread, not at the end
    assert read_plain(store, "files/blob", key, len(plaintext), 0, len(plaintext) - 1) == plaintext


def stalled_spool(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[ContentStore, EncryptedSpool, _FaultyWriter]:
    """A spool whose write-behind thread has started, writing to a disk that now stalls."""
    store, opened = faulty_store(monkeypatch)
    spool = EncryptedSpool(store, data_key=new_data_key(), aad_prefix=b"file-1")
    spool.write(os.urandom(CHUNK_SIZE))
    opened[0].gate.clear()
    return store, spool, opened[0]


def test_the_spool_waits_for_the_disk_instead_of_queueing_without_bound(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_local_content(settings, tmp_path / "content")
    store, spool, writer = stalled_spool(monkeypatch)
    fed = 0

    def feed() -> None:
        nonlocal fed
        for _ in range(100):
            spool.write(os.urandom(CHUNK_SIZE))
            fed += 1

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    feeder.join(0.5)
    assert feeder.is_alive()  # blocked on the stalled disk
    assert fed <= storage_spool._WRITE_BEHIND_DEPTH  # a few sealed buffers held, not the stream
    writer.gate.set()
    feeder.join(10)
    assert fed == 100
    spool.commit("files/blob")
    assert store.size("files/blob") == encrypted_size(101 * CHUNK_SIZE)


def test_discarding_a_spool_with_writes_queued_stops_them_before_the_abort(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_local_content(settings, tmp_path / "content")
    _, spool, writer = stalled_spool(monkeypatch)
    for _ in range(3):
        spool.write(os.urandom(CHUNK_SIZE))
    threading.Timer(0.2, writer.gate.set).start()
    spool.discard()  # returns once the thread is done with the writer
    time.sleep(0.3)  # past the gate: a thread still running would write now
    assert writer.aborted and not writer.written_after_abort
    assert writer.writes <= 2  # the one under way finished, the queued ones were dropped
    assert [p for p in (tmp_path / "content").rglob("*") if p.is_file()] == []
