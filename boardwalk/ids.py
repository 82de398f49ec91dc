"""Opaque identifiers with a type prefix (docs/API.md "Identifiers, keys and scopes"): file-…,
batch_…, req_…, mcfg_…, org_…."""

from __future__ import annotations

import hashlib
import math
import secrets

_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def new_id(prefix: str, length: int = 24) -> str:
    """`length` random characters: digits of a random number with 112 bits more than they
    need, so each is uniform to within 2^-112 (one read of the system's randomness, not one
    per character: a batch's items take two ids each)."""
    bits = math.ceil(length * math.log2(len(_ALPHABET))) + 112
    return _digits(prefix, int.from_bytes(secrets.token_bytes(-(-bits // 8)), "big"), length)


def derived_id(prefix: str, *parts: str, length: int = 24) -> str:
    """A stable id computed from other ids, so a retried step finds the row it made before."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return _digits(prefix, int.from_bytes(digest, "big"), length)


def _digits(prefix: str, number: int, length: int) -> str:
    chars = []
    for _ in range(length):
        number, rem = divmod(number, len(_ALPHABET))
        chars.append(_ALPHABET[rem])
    return prefix + "".join(chars)
