"""Opaque identifiers with a type prefix (SPEC §1): file-…, batch_…, req_…, mcfg_…, org_…."""

from __future__ import annotations

import hashlib
import secrets

_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def new_id(prefix: str, length: int = 24) -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def derived_id(prefix: str, *parts: str, length: int = 24) -> str:
    """A stable id computed from other ids, so a retried step finds the row it made before."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    number = int.from_bytes(digest, "big")
    chars = []
    for _ in range(length):
        number, rem = divmod(number, len(_ALPHABET))
        chars.append(_ALPHABET[rem])
    return prefix + "".join(chars)
