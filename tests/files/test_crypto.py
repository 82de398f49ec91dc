"""Chunked AES-256-GCM content encryption and master-key wrapping (docs/ARCHITECTURE.md decision 6).
No database."""

from __future__ import annotations

import base64
import hashlib
import random
import secrets
from collections.abc import Callable

import pytest
from django.core.exceptions import ImproperlyConfigured
from pytest_django import Settings

from files.crypto import (
    CHUNK_SIZE,
    STORED_CHUNK_SIZE,
    TAG_SIZE,
    ChunkEncryptor,
    Keyring,
    TamperedContent,
    UnknownMasterKey,
    chunk_span,
    decrypt_range,
    encrypt_bytes,
    encrypted_size,
    new_data_key,
)

AAD = b"file-abc"
SIZES = [0, 1, CHUNK_SIZE - 1, CHUNK_SIZE, CHUNK_SIZE + 1, 5 * CHUNK_SIZE + 7]


def reader(blob: bytes, calls: list[tuple[int, int]] | None = None) -> Callable[[int, int], bytes]:
    def read(offset: int, length: int) -> bytes:
        if calls is not None:
            calls.append((offset, length))
        return blob[offset : offset + length]

    return read


def decrypt(
    blob: bytes, key: bytes, size: int, start: int = 0, end: int | None = None, aad: bytes = AAD
) -> bytes:
    end = size - 1 if end is None else end
    pieces = decrypt_range(
        reader(blob), data_key=key, aad_prefix=aad, plaintext_size=size, start=start, end=end
    )
    return b"".join(pieces)


def encrypt_streamed(plaintext: bytes, key: bytes, rng: random.Random) -> bytes:
    """Feeds the encryptor uneven pieces, as an upload does."""
    encryptor = ChunkEncryptor(key, AAD)
    out = bytearray()
    pos = 0
    while pos < len(plaintext):
        step = rng.choice([1, 7, 1000, CHUNK_SIZE - 3, CHUNK_SIZE, 3 * CHUNK_SIZE + 5])
        out += encryptor.update(plaintext[pos : pos + step])
        pos += step
    out += encryptor.finalize()
    assert encryptor.plaintext_size == len(plaintext)
    return bytes(out)


def key_setting(*entries: tuple[str, bytes]) -> str:
    return ",".join(f"{key_id}:{base64.b64encode(key).decode()}" for key_id, key in entries)


@pytest.mark.parametrize("size", SIZES)
def test_roundtrip_whole_file_and_random_ranges(size: int) -> None:
    rng = random.Random(size)  # noqa: S311 (reproducible test data, not a secret)
    plaintext = rng.randbytes(size)
    key = new_data_key()
    blob = encrypt_streamed(plaintext, key, rng)

    assert len(blob) == encrypted_size(size)
    assert blob == encrypt_bytes(plaintext, data_key=key, aad_prefix=AAD)
    assert decrypt(blob, key, size) == plaintext
    for _ in range(30 if size else 0):
        start = rng.randrange(size)
        end = rng.randrange(start, size)
        assert decrypt(blob, key, size, start, end) == plaintext[start : end + 1]


@pytest.mark.parametrize("size", SIZES)
def test_empty_range_yields_nothing(size: int) -> None:
    key = new_data_key()
    blob = encrypt_bytes(bytes(size), data_key=key, aad_prefix=AAD)
    assert decrypt(blob, key, size, start=size, end=size - 1) == b""


def test_range_outside_the_file_is_refused() -> None:
    key = new_data_key()
    blob = encrypt_bytes(b"hello", data_key=key, aad_prefix=AAD)
    for start, end in [(0, 5), (-1, 2), (3, 1), (6, 5)]:
        with pytest.raises(ValueError):
            decrypt(blob, key, 5, start, end)


def test_stored_layout_has_one_tag_per_chunk_and_always_a_final_chunk() -> None:
    assert encrypted_size(0) == TAG_SIZE
    assert encrypted_size(CHUNK_SIZE - 1) == CHUNK_SIZE - 1 + TAG_SIZE
    assert encrypted_size(CHUNK_SIZE) == CHUNK_SIZE + 2 * TAG_SIZE
    assert encrypted_size(5 * CHUNK_SIZE + 7) == 5 * STORED_CHUNK_SIZE + 7 + TAG_SIZE
    assert chunk_span(0, 0) == (0, 0)
    assert chunk_span(CHUNK_SIZE - 1, CHUNK_SIZE) == (0, 1)
    assert chunk_span(3 * CHUNK_SIZE + 1, 5 * CHUNK_SIZE + 6) == (3, 5)


def test_update_emits_complete_chunks_and_buffers_less_than_one() -> None:
    encryptor = ChunkEncryptor(new_data_key(), AAD)
    assert encryptor.update(bytes(CHUNK_SIZE - 1)) == b""
    assert len(encryptor.update(bytes(2))) == STORED_CHUNK_SIZE
    assert len(encryptor.update(bytes(2 * CHUNK_SIZE))) == 2 * STORED_CHUNK_SIZE
    assert len(encryptor.finalize()) == 1 + TAG_SIZE
    with pytest.raises(ValueError):
        encryptor.update(b"more")


def test_range_reads_only_the_chunks_it_spans_in_groups() -> None:
    size = 40 * CHUNK_SIZE + 3
    key = new_data_key()
    plaintext = secrets.token_bytes(size)
    blob = encrypt_bytes(plaintext, data_key=key, aad_prefix=AAD)

    calls: list[tuple[int, int]] = []
    start, end = 2 * CHUNK_SIZE + 5, 3 * CHUNK_SIZE + 9
    pieces = decrypt_range(
        reader(blob, calls), data_key=key, aad_prefix=AAD, plaintext_size=size, start=start, end=end
    )
    assert b"".join(pieces) == plaintext[start : end + 1]
    assert calls == [(2 * STORED_CHUNK_SIZE, 2 * STORED_CHUNK_SIZE)]

    calls.clear()
    assert decrypt_range_all(blob, key, size, calls) == plaintext
    assert len(calls) == 3  # 41 chunks in groups of 16
    assert calls[-1] == (32 * STORED_CHUNK_SIZE, 8 * STORED_CHUNK_SIZE + 3 + TAG_SIZE)


def decrypt_range_all(blob: bytes, key: bytes, size: int, calls: list[tuple[int, int]]) -> bytes:
    pieces = decrypt_range(
        reader(blob, calls),
        data_key=key,
        aad_prefix=AAD,
        plaintext_size=size,
        start=0,
        end=size - 1,
    )
    return b"".join(pieces)


@pytest.mark.parametrize("tampered_chunk", [0, 3, 5])
def test_flipped_bit_fails_before_any_byte_of_that_chunk(tampered_chunk: int) -> None:
    size = 5 * CHUNK_SIZE + 7
    key = new_data_key()
    plaintext = secrets.token_bytes(size)
    blob = bytearray(encrypt_bytes(plaintext, data_key=key, aad_prefix=AAD))
    blob[tampered_chunk * STORED_CHUNK_SIZE + 3] ^= 0x10

    received = bytearray()
    pieces = decrypt_range(
        reader(bytes(blob)),
        data_key=key,
        aad_prefix=AAD,
        plaintext_size=size,
        start=0,
        end=size - 1,
    )
    with pytest.raises(TamperedContent):
        for piece in pieces:
            received += piece
    assert received == plaintext[: tampered_chunk * CHUNK_SIZE]


def test_flipped_tag_bit_is_detected() -> None:
    key = new_data_key()
    blob = bytearray(encrypt_bytes(b"x" * 100, data_key=key, aad_prefix=AAD))
    blob[-1] ^= 0x01
    with pytest.raises(TamperedContent):
        decrypt(bytes(blob), key, 100)


def test_dropping_the_final_chunk_is_detected() -> None:
    # Exactly two full chunks: the stored form ends with an empty final chunk (its tag only).
    size = 2 * CHUNK_SIZE
    key = new_data_key()
    blob = encrypt_bytes(secrets.token_bytes(size), data_key=key, aad_prefix=AAD)
    truncated = blob[: 2 * STORED_CHUNK_SIZE]
    with pytest.raises(TamperedContent):
        decrypt(truncated, key, size)
    # Claiming the shorter size does not help: chunk 1 was not sealed as the final one.
    with pytest.raises(TamperedContent):
        decrypt(truncated, key, size - 1)


def test_empty_file_without_its_chunk_is_detected() -> None:
    key = new_data_key()
    blob = encrypt_bytes(b"", data_key=key, aad_prefix=AAD)
    assert decrypt(blob, key, 0) == b""
    with pytest.raises(TamperedContent):
        decrypt(b"", key, 0)


def test_cutting_bytes_off_the_end_is_detected() -> None:
    size = 3 * CHUNK_SIZE + 100
    key = new_data_key()
    blob = encrypt_bytes(secrets.token_bytes(size), data_key=key, aad_prefix=AAD)
    with pytest.raises(TamperedContent):
        decrypt(blob[:-1], key, size)
    with pytest.raises(TamperedContent):
        decrypt(blob[: 3 * STORED_CHUNK_SIZE], key, size)


def test_extending_past_the_final_chunk_is_detected() -> None:
    size = CHUNK_SIZE + 10
    key = new_data_key()
    plaintext = secrets.token_bytes(size)
    blob = encrypt_bytes(plaintext, data_key=key, aad_prefix=AAD)
    # Claiming more bytes than were sealed: the final chunk is read as a non-final one.
    other = encrypt_bytes(secrets.token_bytes(size), data_key=key, aad_prefix=AAD)
    with pytest.raises(TamperedContent):
        decrypt(blob + other, key, 2 * size)


def test_swapping_chunks_is_detected() -> None:
    size = 3 * CHUNK_SIZE + 5
    key = new_data_key()
    blob = encrypt_bytes(secrets.token_bytes(size), data_key=key, aad_prefix=AAD)
    first, second = blob[:STORED_CHUNK_SIZE], blob[STORED_CHUNK_SIZE : 2 * STORED_CHUNK_SIZE]
    swapped = second + first + blob[2 * STORED_CHUNK_SIZE :]
    with pytest.raises(TamperedContent):
        decrypt(swapped, key, size)


def test_chunk_from_another_file_with_the_same_key_is_detected() -> None:
    key = new_data_key()
    size = 2 * CHUNK_SIZE + 1
    ours = encrypt_bytes(secrets.token_bytes(size), data_key=key, aad_prefix=b"file-1")
    theirs = encrypt_bytes(secrets.token_bytes(size), data_key=key, aad_prefix=b"file-2")
    spliced = ours[:STORED_CHUNK_SIZE] + theirs[STORED_CHUNK_SIZE:]
    with pytest.raises(TamperedContent):
        decrypt(spliced, key, size, aad=b"file-1")
    with pytest.raises(TamperedContent):
        decrypt(ours, key, size, aad=b"file-2")


def test_wrong_data_key_is_detected() -> None:
    blob = encrypt_bytes(b"secret", data_key=new_data_key(), aad_prefix=AAD)
    with pytest.raises(TamperedContent):
        decrypt(blob, new_data_key(), 6)


def test_ciphertext_does_not_contain_the_plaintext() -> None:
    marker = b"PLAINTEXT-MARKER-7f3a"
    blob = encrypt_bytes(marker * 10_000, data_key=new_data_key(), aad_prefix=AAD)
    assert marker not in blob


def test_wrap_and_unwrap() -> None:
    keyring = Keyring.from_setting(key_setting(("a", secrets.token_bytes(32))))
    data_key = new_data_key()
    key_id, wrapped = keyring.wrap(data_key)
    assert key_id == "a"
    assert data_key not in wrapped
    assert keyring.unwrap(key_id, wrapped) == data_key
    # Random nonce: wrapping twice gives different bytes.
    assert keyring.wrap(data_key)[1] != wrapped


def test_rotation_unwraps_old_keys_and_wraps_new_ones_with_the_first() -> None:
    key_a, key_b = secrets.token_bytes(32), secrets.token_bytes(32)
    old = Keyring.from_setting(key_setting(("A", key_a)))
    data_key = new_data_key()
    key_id, wrapped = old.wrap(data_key)

    rotated = Keyring.from_setting(key_setting(("B", key_b), ("A", key_a)))
    assert rotated.current_id == "B"
    assert rotated.key_ids == ["B", "A"]
    assert rotated.unwrap(key_id, wrapped) == data_key
    new_id, new_wrapped = rotated.wrap(data_key)
    assert new_id == "B"
    assert rotated.unwrap(new_id, new_wrapped) == data_key
    with pytest.raises(UnknownMasterKey, match="'B'"):
        old.unwrap(new_id, new_wrapped)


def test_wrapped_key_is_bound_to_its_key_id() -> None:
    # The same key material under two ids: relabelling a wrapped key is still detected.
    key = secrets.token_bytes(32)
    keyring = Keyring.from_setting(key_setting(("one", key), ("two", key)))
    _, wrapped = keyring.wrap(new_data_key())
    with pytest.raises(TamperedContent):
        keyring.unwrap("two", wrapped)


def test_tampered_wrapped_key_is_detected() -> None:
    keyring = Keyring.from_setting(key_setting(("a", secrets.token_bytes(32))))
    key_id, wrapped = keyring.wrap(new_data_key())
    with pytest.raises(TamperedContent):
        keyring.unwrap(key_id, wrapped[:-1] + bytes([wrapped[-1] ^ 1]))
    with pytest.raises(TamperedContent):
        keyring.unwrap(key_id, wrapped[:20])


def test_unknown_key_id_is_a_clear_error() -> None:
    keyring = Keyring.from_setting(key_setting(("a", secrets.token_bytes(32))))
    with pytest.raises(UnknownMasterKey, match=r"'retired'.*not in MASTER_KEYS"):
        keyring.unwrap("retired", b"\0" * 60)


def test_setting_tolerates_spaces_around_entries() -> None:
    key = secrets.token_bytes(32)
    encoded = base64.b64encode(key).decode()
    keyring = Keyring.from_setting(f" k1:{encoded} , k2:{encoded} ")
    assert keyring.key_ids == ["k1", "k2"]


@pytest.mark.parametrize(
    "value",
    [
        "",
        "k1",
        ":" + base64.b64encode(bytes(32)).decode(),
        "k1:not base64!",
        "k1:" + base64.b64encode(bytes(16)).decode(),
        "k1:" + base64.b64encode(bytes(32)).decode() + ",",
        "k 1:" + base64.b64encode(bytes(32)).decode(),
        key_setting(("k1", bytes(32)), ("k1", bytes(32))),
    ],
)
def test_malformed_master_keys_setting_says_the_expected_format(value: str) -> None:
    with pytest.raises(ImproperlyConfigured, match="'id:base64key") as excinfo:
        Keyring.from_setting(value)
    # Never echo key material into an error report.
    assert base64.b64encode(bytes(32)).decode() not in str(excinfo.value)


def test_current_follows_the_setting(settings: Settings) -> None:
    key_a, key_b = secrets.token_bytes(32), secrets.token_bytes(32)
    settings.MASTER_KEYS = key_setting(("A", key_a))
    first = Keyring.current()
    assert first is Keyring.current()
    assert first.current_id == "A"
    settings.MASTER_KEYS = key_setting(("B", key_b), ("A", key_a))
    assert Keyring.current().current_id == "B"


def test_update_reusing_seals_as_update_does_into_one_buffer() -> None:
    key = new_data_key()
    rng = random.Random(7)  # noqa: S311 (reproducible test data, not a secret)
    pieces = [rng.randbytes(size) for size in (10, CHUNK_SIZE, 3 * CHUNK_SIZE + 5, 1, 70_000)]
    fresh, reusing = ChunkEncryptor(key, AAD), ChunkEncryptor(key, AAD)
    views = []
    for piece in pieces:
        expected = fresh.update(piece)
        view = reusing.update_reusing(piece)
        assert bytes(view) == expected
        views.append(view)
    assert reusing.finalize() == fresh.finalize()
    # One buffer, grown when needed: a later call overwrites what an earlier one returned.
    assert views[3].obj is views[2].obj
    with pytest.raises(ValueError):
        reusing.update_reusing(b"more")


def stored_tags(blob: bytes) -> bytes:
    return b"".join(
        blob[start : start + STORED_CHUNK_SIZE][-TAG_SIZE:]
        for start in range(0, len(blob), STORED_CHUNK_SIZE)
    )


@pytest.mark.parametrize("size", SIZES)
def test_tags_digest_is_the_sha256_of_the_stored_tags(size: int) -> None:
    key = new_data_key()
    plaintext = secrets.token_bytes(size)
    encryptor = ChunkEncryptor(key, AAD)
    blob = bytes(encryptor.update(plaintext) + encryptor.finalize())
    assert encryptor.tags_digest() == hashlib.sha256(stored_tags(blob)).hexdigest()


def test_tags_digest_tells_contents_and_keys_apart() -> None:
    def digest(plaintext: bytes, key: bytes) -> str:
        encryptor = ChunkEncryptor(key, AAD)
        encryptor.update(plaintext)
        encryptor.finalize()
        return encryptor.tags_digest()

    key = new_data_key()
    base = bytes(3 * CHUNK_SIZE)
    changed = bytearray(base)
    changed[2 * CHUNK_SIZE + 9] = 1
    assert digest(base, key) == digest(base, key)
    assert digest(bytes(changed), key) != digest(base, key)
    assert digest(base[:-1], key) != digest(base, key)
    assert digest(base, new_data_key()) != digest(base, key)


def test_tags_digest_needs_the_final_chunk() -> None:
    encryptor = ChunkEncryptor(new_data_key(), AAD)
    encryptor.update(b"abc")
    with pytest.raises(ValueError):
        encryptor.tags_digest()
