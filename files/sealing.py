"""Small authenticated envelopes for per-item results (AES-256-GCM, random nonce).

Item results are written one at a time as the engine finishes them, so they cannot use the
chunked file format; each is sealed under its batch's data key with the item's identity as
associated data, so a row cannot be moved to another item or batch unnoticed.
"""

from __future__ import annotations

import os

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

_NONCE = 12


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(_NONCE)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def unseal(key: bytes, sealed: bytes, aad: bytes) -> bytes:
    return AESGCM(key).decrypt(sealed[:_NONCE], sealed[_NONCE:], aad)
