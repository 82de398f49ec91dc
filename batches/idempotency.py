"""Idempotency-Key handling for POST /v1/batches (docs/API.md "Batches").

The key is taken by inserting a record (unique per org); the request that inserted it (the
owner) does the work and then, inside the transaction that creates the batch, points the
record at it. Identical requests that race wait a moment for that batch and answer with it;
a different submission under the key is 409. Refusals release the key (a failed create
consumed nothing).

An owner that dies mid-request (the web process killed) must not block the key for long.
On PostgreSQL the owner holds a session advisory lock on the key for as long as it works:
the database drops it with the dead process's connection, so a retry that can take the lock
while the record still has no batch knows its owner is gone and takes the key over at once.
Elsewhere (SQLite, one web process) a record is taken over once it is clearly abandoned.
Either way the takeover is fenced: the owner completes only its own record (by primary
key), so an owner wrongly presumed dead rolls its batch back instead of making a second one.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from dataclasses import dataclass

import orjson
from django.conf import settings
from django.db import IntegrityError, connection, transaction

from batches.models import Batch, IdempotencyRecord
from boardwalk import clock
from boardwalk.codes import ErrorCode
from boardwalk.errors import Conflict, InvalidRequest
from boardwalk.models import Organization

ABANDONED_AFTER = dt.timedelta(minutes=10)  # without an owner lock to ask (SQLite)
POLL_SECONDS = 0.05


@dataclass(frozen=True)
class KeyClaim:
    """The key is ours: `record_id` is the record we inserted, `lock` the advisory lock id."""

    org_id: str
    key: str
    record_id: int
    lock: int | None


class ClaimLost(Exception):
    """Our record was taken over (we were presumed dead): start again from the key."""


def check_key(raw: str | None) -> str:
    if raw is None:
        raise InvalidRequest(
            "Missing Idempotency-Key header. Send a unique key per batch, e.g. with the OpenAI "
            'SDK: client.batches.create(..., extra_headers={"Idempotency-Key": "my-run-1"}).',
            code=ErrorCode.MISSING_IDEMPOTENCY_KEY,
            param="Idempotency-Key",
        )
    # WSGI hands header values over as latin-1 text of the raw bytes; the limit is on the
    # bytes the client sent, and the key is the UTF-8 text they spell.
    try:
        sent = raw.encode("latin-1")
    except UnicodeEncodeError:  # already decoded text (not from a WSGI server)
        sent = raw.encode()
    try:
        key = sent.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(
            "Idempotency-Key must be UTF-8 text.",
            code=ErrorCode.INVALID_IDEMPOTENCY_KEY,
            param="Idempotency-Key",
        ) from None
    if not 1 <= len(sent) <= 256:
        raise InvalidRequest(
            f"Idempotency-Key must be 1 to 256 bytes in UTF-8; it is {len(sent)}.",
            code=ErrorCode.INVALID_IDEMPOTENCY_KEY,
            param="Idempotency-Key",
        )
    return key


def request_hash(body: dict) -> str:
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _lock_id(org: Organization, key: str) -> int:
    digest = hashlib.sha256(f"idempotency\0{org.id}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _try_lock(lock: int | None) -> bool:
    """Take the owner lock without waiting; always granted where there is none (SQLite)."""
    if lock is None:
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [lock])
        return bool(cursor.fetchone()[0])


def _unlock(lock: int | None) -> None:
    if lock is None:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [lock])


def key_acquire(*, org: Organization, key: str, digest: str) -> Batch | KeyClaim:
    """Take the key (a KeyClaim: go ahead and create) or return the batch it made before.

    The owner lock is taken before the record is inserted and kept until `key_done`, so a
    record without a batch whose lock anyone can take has no living owner.
    """
    lock = _lock_id(org, key) if connection.vendor == "postgresql" else None
    deadline = time.monotonic() + settings.IDEMPOTENCY_WAIT_SECONDS
    while True:
        held = _try_lock(lock)
        try:
            if held:
                try:
                    with transaction.atomic():
                        created = IdempotencyRecord.objects.create(
                            org=org, key=key, request_hash=digest
                        )
                    claim = KeyClaim(org.id, key, created.pk, lock)
                    held = False  # kept by the claim until key_done
                    return claim
                except IntegrityError:
                    pass
            record = (
                IdempotencyRecord.objects.filter(org=org, key=key).select_related("batch").first()
            )
            if record is not None:
                if record.request_hash != digest:
                    raise Conflict(
                        "This Idempotency-Key was already used for a different batch "
                        "submission. Use a new key for a new batch.",
                        code=ErrorCode.IDEMPOTENCY_KEY_REUSED,
                        param="Idempotency-Key",
                    )
                if record.batch is not None:
                    return record.batch
                owner_gone = held and lock is not None
                if owner_gone or record.created_at < clock.now() - ABANDONED_AFTER:
                    IdempotencyRecord.objects.filter(pk=record.pk, batch__isnull=True).delete()
                    continue
            elif held:
                continue  # released in between: try to take it again
        finally:
            if held:
                _unlock(lock)
        if time.monotonic() >= deadline:
            raise Conflict(
                "A request with this Idempotency-Key is still being processed; retry shortly.",
                code=ErrorCode.IDEMPOTENCY_KEY_IN_USE,
                param="Idempotency-Key",
                retry_after=1,
            )
        time.sleep(POLL_SECONDS)


def key_complete(*, claim: KeyClaim, batch: Batch) -> None:
    """Caller is inside the transaction that created `batch`; raises ClaimLost (rolling the
    batch back) if our record was taken over meanwhile."""
    if not IdempotencyRecord.objects.filter(pk=claim.record_id, batch__isnull=True).update(
        batch=batch
    ):
        raise ClaimLost(claim.key)


def key_release(*, claim: KeyClaim) -> None:
    """The create was refused: the key is free again (only our own record goes)."""
    IdempotencyRecord.objects.filter(pk=claim.record_id, batch__isnull=True).delete()


def key_done(*, claim: KeyClaim) -> None:
    """Let go of the owner lock (after the create committed or the key was released)."""
    _unlock(claim.lock)
