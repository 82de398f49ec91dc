"""Idempotency-Key handling for POST /v1/batches (SPEC §5.1).

The key is taken by inserting a record (unique per org); the request that inserted it does
the work and then points the record at its batch. Identical requests that race wait a
moment for that batch and answer with it; a different submission under the key is 409.
Refusals release the key (a failed create consumed nothing), and a record left behind by
a process that died mid-request is taken over once it is clearly abandoned.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time

import orjson
from django.conf import settings
from django.db import IntegrityError, transaction

from batches.models import Batch, IdempotencyRecord
from boardwalk import clock
from boardwalk.errors import Conflict, InvalidRequest
from boardwalk.models import Organization

ABANDONED_AFTER = dt.timedelta(minutes=10)
POLL_SECONDS = 0.05


def check_key(raw: str | None) -> str:
    if raw is None:
        raise InvalidRequest(
            "Missing Idempotency-Key header. Send a unique key per batch, e.g. with the OpenAI "
            'SDK: client.batches.create(..., extra_headers={"Idempotency-Key": "my-run-1"}).',
            code="missing_idempotency_key",
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
            code="invalid_idempotency_key",
            param="Idempotency-Key",
        ) from None
    if not 1 <= len(sent) <= 256:
        raise InvalidRequest(
            f"Idempotency-Key must be 1 to 256 bytes in UTF-8; it is {len(sent)}.",
            code="invalid_idempotency_key",
            param="Idempotency-Key",
        )
    return key


def request_hash(body: dict) -> str:
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def key_acquire(*, org: Organization, key: str, digest: str) -> Batch | None:
    """Take the key (returns None: go ahead and create) or return the batch it made before."""
    deadline = time.monotonic() + settings.IDEMPOTENCY_WAIT_SECONDS
    while True:
        try:
            with transaction.atomic():
                IdempotencyRecord.objects.create(org=org, key=key, request_hash=digest)
            return None
        except IntegrityError:
            pass
        record = IdempotencyRecord.objects.filter(org=org, key=key).select_related("batch").first()
        if record is None:
            continue  # released in between: try to take it again
        if record.request_hash != digest:
            raise Conflict(
                "This Idempotency-Key was already used for a different batch submission. "
                "Use a new key for a new batch.",
                code="idempotency_key_reused",
                param="Idempotency-Key",
            )
        if record.batch is not None:
            return record.batch
        if record.created_at < clock.now() - ABANDONED_AFTER:
            IdempotencyRecord.objects.filter(pk=record.pk, batch__isnull=True).delete()
            continue
        if time.monotonic() >= deadline:
            raise Conflict(
                "A request with this Idempotency-Key is still being processed; retry shortly.",
                code="idempotency_key_in_use",
                param="Idempotency-Key",
                retry_after=1,
            )
        time.sleep(POLL_SECONDS)


def key_complete(*, org: Organization, key: str, batch: Batch) -> None:
    """Caller is inside the transaction that created `batch`."""
    IdempotencyRecord.objects.filter(org=org, key=key, batch__isnull=True).update(batch=batch)


def key_release(*, org: Organization, key: str) -> None:
    IdempotencyRecord.objects.filter(org=org, key=key, batch__isnull=True).delete()
