"""Encryption of stored content (docs/ARCHITECTURE.md decision 6): a random data key per file,
wrapped by a master key.

Content is sealed in fixed chunks of AES-256-GCM so that a byte range can be decrypted and
verified without reading the whole file. Chunk i of the stored blob starts at
i * STORED_CHUNK_SIZE and holds CHUNK_SIZE bytes of ciphertext followed by its 16-byte tag; the
last chunk is always short (possibly empty) and marked final, so an empty file still has one
chunk and cutting a file at a chunk boundary is detected.

The nonce is the chunk index: safe because each data key encrypts exactly one file, once.
The associated data binds each chunk to its file (`aad_prefix`, e.g. the file id), its
position and whether it is the last, so swapping, reordering, truncating or extending chunks
all fail authentication.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import secrets
from collections.abc import Callable, Iterator

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

CHUNK_SIZE = 64 * 1024
TAG_SIZE = 16
STORED_CHUNK_SIZE = CHUNK_SIZE + TAG_SIZE
KEY_SIZE = 32
# Chunks fetched per read call when decrypting a range: 1 MiB of plaintext.
READ_GROUP_CHUNKS = 16

_NONCE_SIZE = 12
_WRAP_AAD = b"boardwalk/data-key/v1:"
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_SETTING_FORMAT = (
    "MASTER_KEYS (BOARDWALK_MASTER_KEYS) must be 'id:base64key[,id:base64key...]': "
    "ids of letters, digits, '_', '.' or '-' (at most 64), each key 32 bytes in standard "
    "base64, the first being the one that wraps new keys"
)


class CryptoError(Exception):
    pass


class TamperedContent(CryptoError):
    """Stored bytes failed authentication: modified, truncated, misplaced or wrong key."""


class KeyDestroyed(CryptoError):
    """The row's wrapped data key is gone (deleted or expired content): nothing can decrypt it."""


class UnknownMasterKey(CryptoError):
    """A wrapped data key names a master key that is not configured (any longer)."""


def new_data_key() -> bytes:
    return secrets.token_bytes(KEY_SIZE)


def encrypted_size(plaintext_size: int) -> int:
    """Stored size of a file of `plaintext_size` bytes (one tag per chunk, final included)."""
    return plaintext_size + TAG_SIZE * (plaintext_size // CHUNK_SIZE + 1)


def chunk_span(start: int, end_inclusive: int) -> tuple[int, int]:
    """Indexes of the first and last chunk holding plaintext bytes [start, end_inclusive]."""
    return start // CHUNK_SIZE, end_inclusive // CHUNK_SIZE


def _nonce(index: int) -> bytes:
    return index.to_bytes(_NONCE_SIZE, "big")


def _chunk_aad(aad_prefix: bytes, index: int, *, final: bool) -> bytes:
    return aad_prefix + index.to_bytes(8, "big") + (b"\x01" if final else b"\x00")


class Keyring:
    """Master keys by id; the first one wraps new data keys, every one still unwraps."""

    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        if not keys:
            raise ImproperlyConfigured(_SETTING_FORMAT + "; it is empty")
        self.current_id = keys[0][0]
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys}

    @classmethod
    def from_setting(cls, value: str) -> Keyring:
        keys: list[tuple[str, bytes]] = []
        seen: set[str] = set()
        for position, entry in enumerate(value.split(","), start=1):
            key_id, sep, encoded = entry.strip().partition(":")
            # Messages name the entry, never its value: this is key material.
            if not sep or not _KEY_ID.fullmatch(key_id):
                raise ImproperlyConfigured(f"{_SETTING_FORMAT}; entry {position} is malformed")
            if key_id in seen:
                raise ImproperlyConfigured(f"{_SETTING_FORMAT}; id {key_id!r} appears twice")
            try:
                key = base64.b64decode(encoded.strip(), validate=True)
            except binascii.Error:
                raise ImproperlyConfigured(
                    f"{_SETTING_FORMAT}; key {key_id!r} is not valid base64"
                ) from None
            if len(key) != KEY_SIZE:
                raise ImproperlyConfigured(
                    f"{_SETTING_FORMAT}; key {key_id!r} is {len(key)} bytes, not {KEY_SIZE}"
                )
            seen.add(key_id)
            keys.append((key_id, key))
        return cls(keys)

    @classmethod
    def current(cls) -> Keyring:
        """The keyring of settings.MASTER_KEYS, parsed once per distinct setting value."""
        global _current
        value = settings.MASTER_KEYS
        cached = _current
        if cached is not None and cached[0] == value:
            return cached[1]
        keyring = cls.from_setting(value)
        _current = (value, keyring)
        return keyring

    @property
    def key_ids(self) -> list[str]:
        return list(self._ciphers)

    def wrap(self, data_key: bytes) -> tuple[str, bytes]:
        """Seal `data_key` under the current master key; returns (key_id, wrapped)."""
        nonce = secrets.token_bytes(_NONCE_SIZE)
        sealed = self._ciphers[self.current_id].encrypt(nonce, data_key, self._aad(self.current_id))
        return self.current_id, nonce + sealed

    def unwrap(self, key_id: str, wrapped: bytes | memoryview | None) -> bytes:
        if wrapped is None:
            raise KeyDestroyed("the data key was destroyed: the content is deleted")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise UnknownMasterKey(
                f"data key was wrapped by master key {key_id!r}, which is not in MASTER_KEYS"
            )
        wrapped = bytes(wrapped)
        if len(wrapped) != _NONCE_SIZE + KEY_SIZE + TAG_SIZE:
            raise TamperedContent(f"wrapped data key is {len(wrapped)} bytes, not a wrapped key")
        try:
            return cipher.decrypt(wrapped[:_NONCE_SIZE], wrapped[_NONCE_SIZE:], self._aad(key_id))
        except InvalidTag:
            raise TamperedContent(
                f"wrapped data key failed authentication under master key {key_id!r}"
            ) from None

    @staticmethod
    def _aad(key_id: str) -> bytes:
        return _WRAP_AAD + key_id.encode()


_current: tuple[str, Keyring] | None = None


class ChunkEncryptor:
    """Streams plaintext in, sealed chunks out; buffers less than one chunk."""

    def __init__(self, data_key: bytes, aad_prefix: bytes) -> None:
        self._cipher = AESGCM(data_key)
        self._aad_prefix = bytes(aad_prefix)
        self._buffer = bytearray()
        self._index = 0
        self._finalized = False
        self._out = bytearray()
        self._tags = bytearray()
        self.plaintext_size = 0

    @property
    def buffered(self) -> int:
        """Plaintext bytes held back until their chunk completes."""
        return len(self._buffer)

    def update(self, data: bytes | bytearray | memoryview) -> bytearray:
        """Ciphertext of every chunk completed by `data` (possibly empty)."""
        view = memoryview(data).cast("B")
        out = bytearray(self._sealed_size(len(view)))
        self._seal_chunks(view, memoryview(out))
        return out

    def update_reusing(self, data: bytes | bytearray | memoryview) -> memoryview:
        """As `update`, sealed into a buffer of the encryptor's that the next call overwrites.

        For a caller that writes the result out at once: a fresh megabyte-sized buffer per
        call costs about as much as the encryption itself.
        """
        self._out, sealed = self.update_into(data, self._out)
        return sealed

    def update_into(
        self, data: bytes | bytearray | memoryview, buffer: bytearray
    ) -> tuple[bytearray, memoryview]:
        """As `update`, sealed into `buffer` (replaced by a larger one if it is too small).

        Returns the buffer that holds the result and the sealed bytes as a view of it.
        """
        view = memoryview(data).cast("B")
        size = self._sealed_size(len(view))
        if len(buffer) < size:
            buffer = bytearray(size)
        out = memoryview(buffer)[:size]
        self._seal_chunks(view, out)
        return buffer, out

    def _sealed_size(self, added: int) -> int:
        if self._finalized:
            raise ValueError("ChunkEncryptor already finalized")
        return (len(self._buffer) + added) // CHUNK_SIZE * STORED_CHUNK_SIZE

    def _seal_chunks(self, view: memoryview, out_view: memoryview) -> None:
        """Seal the chunks `view` completes into `out_view` (sized by `_sealed_size`)."""
        self.plaintext_size += len(view)
        buffered = len(self._buffer)
        count = len(out_view) // STORED_CHUNK_SIZE
        if count == 0:
            self._buffer += view
            return
        # Sealed in place into one output buffer: joining per-chunk results costs more than
        # the encryption itself.
        pos = 0
        if buffered:
            pos = CHUNK_SIZE - buffered
            self._buffer += view[:pos]
            self._seal_into(self._buffer, out_view[:STORED_CHUNK_SIZE])
            self._buffer.clear()
        # Whole chunks straight from the caller's buffer: no copy into ours.
        for slot in range(1 if buffered else 0, count):
            self._seal_into(
                view[pos : pos + CHUNK_SIZE],
                out_view[slot * STORED_CHUNK_SIZE : (slot + 1) * STORED_CHUNK_SIZE],
            )
            pos += CHUNK_SIZE
        self._buffer += view[pos:]

    def finalize(self) -> bytearray:
        """The final chunk (the short remainder, possibly empty)."""
        if self._finalized:
            raise ValueError("ChunkEncryptor already finalized")
        self._finalized = True
        out = bytearray(len(self._buffer) + TAG_SIZE)
        self._seal_into(self._buffer, memoryview(out), final=True)
        self._buffer = bytearray()
        self._out = bytearray()
        return out

    def _seal_into(
        self, chunk: bytes | bytearray | memoryview, out: memoryview, *, final: bool = False
    ) -> None:
        index = self._index
        self._index += 1
        aad = _chunk_aad(self._aad_prefix, index, final=final)
        self._cipher.encrypt_into(_nonce(index), chunk, aad, out)
        self._tags += out[-TAG_SIZE:]

    def tags_digest(self) -> str:
        """SHA-256 (hex) of the chunk tags in order, once finalized: a strong ETag for free.

        Each tag authenticates its chunk's ciphertext, index and finality under the file's
        own key: two different contents give the same sequence of tags only by a GCM forgery,
        so this identifies the stored content as well as a hash of the plaintext does, without
        a second pass over every byte (that hash cost as much as the encryption).
        """
        if not self._finalized:
            raise ValueError("ChunkEncryptor not finalized yet")
        return hashlib.sha256(self._tags).hexdigest()


def encrypt_bytes(plaintext: bytes, *, data_key: bytes, aad_prefix: bytes) -> bytes:
    """The whole stored form of a small plaintext held in memory."""
    encryptor = ChunkEncryptor(data_key, aad_prefix)
    return bytes(encryptor.update(plaintext) + encryptor.finalize())


def decrypt_range(
    read: Callable[[int, int], bytes],
    *,
    data_key: bytes,
    aad_prefix: bytes,
    plaintext_size: int,
    start: int,
    end: int,
) -> Iterator[bytes]:
    """Yield plaintext bytes [start, end] (inclusive), one verified chunk's worth at a time.

    `read(offset, length)` returns stored bytes (fewer at the end of the blob). Only the
    chunks covering the range are read and each is authenticated before any of its bytes
    are yielded; TamperedContent is raised instead. A range reaching the end of the file
    also verifies the final chunk. `end == start - 1` is the empty range (e.g. the whole of
    an empty file).
    """
    if not (0 <= start <= plaintext_size and start - 1 <= end < plaintext_size):
        raise ValueError(f"range {start}-{end} is outside a file of {plaintext_size} bytes")
    final_index = plaintext_size // CHUNK_SIZE
    if end == plaintext_size - 1:
        # Reaching the end means checking the final chunk too, even when it holds no byte of
        # the range (an empty file, or a size that is a multiple of CHUNK_SIZE): else cutting
        # the blob at a chunk boundary would go unnoticed.
        first, last = start // CHUNK_SIZE, final_index
    elif end < start:
        return
    else:
        first, last = chunk_span(start, end)
    cipher = AESGCM(data_key)
    aad_prefix = bytes(aad_prefix)
    for group_first in range(first, last + 1, READ_GROUP_CHUNKS):
        group_last = min(group_first + READ_GROUP_CHUNKS - 1, last)
        offset = group_first * STORED_CHUNK_SIZE
        if group_last == final_index:
            length = (group_last - group_first) * STORED_CHUNK_SIZE
            length += plaintext_size % CHUNK_SIZE + TAG_SIZE
        else:
            length = (group_last - group_first + 1) * STORED_CHUNK_SIZE
        stored = memoryview(read(offset, length))[:length]
        if len(stored) < length:
            raise TamperedContent(
                f"stored content is truncated: {len(stored)} of {length} bytes at {offset}"
            )
        for index in range(group_first, group_last + 1):
            pos = (index - group_first) * STORED_CHUNK_SIZE
            sealed = stored[pos : pos + STORED_CHUNK_SIZE]
            try:
                plain = cipher.decrypt(
                    _nonce(index),
                    sealed,
                    _chunk_aad(aad_prefix, index, final=index == final_index),
                )
            except InvalidTag:
                raise TamperedContent(f"chunk {index} failed authentication") from None
            chunk_start = index * CHUNK_SIZE
            lo = max(start - chunk_start, 0)
            hi = min(end - chunk_start + 1, len(plain))
            if lo == 0 and hi == len(plain) and plain:
                yield plain
            elif lo < hi:
                yield plain[lo:hi]
