"""Standard Webhooks signatures (https://www.standardwebhooks.com, docs/API.md "Webhooks").

`webhook-signature: v1,<base64 HMAC-SHA256 over "{id}.{timestamp}.{body}">`, keyed with the
bytes of the secret after its `whsec_` prefix (base64-decoded). While a rotated secret is
kept, the header holds one signature per secret, separated by a space (receivers accept any).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret
KEY_BYTES = 32


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def secret_text(key: bytes) -> str:
    return SECRET_PREFIX + base64.b64encode(key).decode()


def secret_hint(key: bytes) -> str:
    """The prefix and the last four characters of the secret: tells secrets apart, and is
    far too little of the key to help forge a signature."""
    return f"{SECRET_PREFIX}...{secret_text(key).rstrip('=')[-4:]}"


def signature(key: bytes, *, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(keys: list[bytes], *, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers, signed with each of `keys` (the current one first)."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(
            signature(key, msg_id=msg_id, timestamp=timestamp, body=body) for key in keys
        ),
    }
