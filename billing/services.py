"""Writes to the credit ledger. Every entry is keyed, so a retry can never double-count."""

from __future__ import annotations

import datetime as dt
import logging
import secrets

from django.db import IntegrityError, transaction

from billing.metering import UsageClass, spend_record
from billing.models import LedgerEntry
from boardwalk import clock
from boardwalk.codes import ErrorCode
from boardwalk.errors import InvalidRequest
from boardwalk.models import Organization

logger = logging.getLogger(__name__)


def _append(
    *,
    org_id: str,
    kind: str,
    amount: int,
    key: str,
    batch_id: str = "",
    memo: str = "",
    at: dt.datetime | None = None,
) -> bool:
    """Append one entry; False if an entry with this key exists already (a retry)."""
    try:
        with transaction.atomic():
            LedgerEntry.objects.create(
                org_id=org_id,
                kind=kind,
                amount_microusd=amount,
                idempotency_key=key,
                batch_id=batch_id,
                memo=memo,
                created_at=at or clock.now(),
            )
    except IntegrityError:
        if LedgerEntry.objects.filter(idempotency_key=key).exists():
            return False
        raise
    return True


def credit_grant(*, org: Organization, amount_microusd: int, memo: str = "") -> LedgerEntry:
    if amount_microusd <= 0:
        raise InvalidRequest(
            "A credit grant must be a positive number of micro-USD.", code=ErrorCode.INVALID_AMOUNT
        )
    key = f"grant:{secrets.token_hex(12)}"
    _append(org_id=org.id, kind=LedgerEntry.Kind.GRANT, amount=amount_microusd, key=key, memo=memo)
    logger.info("credit granted org=%s amount=%s", org.id, amount_microusd)
    return LedgerEntry.objects.get(idempotency_key=key)


def credit_hold(*, org_id: str, batch_id: str, amount_microusd: int) -> None:
    """Reserve credit for a batch. Caller holds the org row lock and checked availability."""
    _append(
        org_id=org_id,
        kind=LedgerEntry.Kind.HOLD,
        amount=amount_microusd,
        key=f"hold:{batch_id}",
        batch_id=batch_id,
    )


def _hold_release(*, org_id: str, batch_id: str) -> None:
    """Append the release of the batch's (or request's) hold, if it has one; once."""
    hold = LedgerEntry.objects.filter(idempotency_key=f"hold:{batch_id}").first()
    if hold is not None:
        _append(
            org_id=org_id,
            kind=LedgerEntry.Kind.RELEASE,
            amount=hold.amount_microusd,
            key=f"release:{batch_id}",
            batch_id=batch_id,
        )


def credit_settle(
    *,
    org_id: str,
    batch_id: str,
    charge_microusd: int,
    revision_id: str,
    deployment_id: str = "",
    usage_class: UsageClass = "batch",
) -> None:
    """Replace a batch's (or an interactive request's) hold by its actual charge; safe to
    call any number of times.

    The charge is added to the usage rollup (the dashboard's spend) only when its ledger
    entry is appended, in the same transaction: spend and ledger cannot disagree.
    """
    now = clock.now()
    with transaction.atomic():
        _hold_release(org_id=org_id, batch_id=batch_id)
        if charge_microusd > 0 and _append(
            org_id=org_id,
            kind=LedgerEntry.Kind.CHARGE,
            amount=charge_microusd,
            key=f"charge:{batch_id}",
            batch_id=batch_id,
            at=now,
        ):
            spend_record(
                org_id=org_id,
                revision_id=revision_id,
                deployment_id=deployment_id,
                amount_microusd=charge_microusd,
                at=now,
                usage_class=usage_class,
            )


def credit_void(
    *,
    org_id: str,
    batch_id: str,
    revision_id: str,
    deployment_id: str = "",
    usage_class: UsageClass = "interactive",
    memo: str = "",
) -> int:
    """Settle an interactive request that was answered with an error: nothing charged.

    Its hold is released and its charge entry written at 0, so a worker that settles it later
    (it ran on after all) appends no charge: the ledger's key decides who settled first. A
    charge a worker appended before the error answer is given back by a refund entry (and
    taken out of the rollup's spend). Safe to call any number of times; returns the µUSD
    refunded by this call.
    """
    now = clock.now()
    with transaction.atomic():
        _hold_release(org_id=org_id, batch_id=batch_id)
        if _append(
            org_id=org_id,
            kind=LedgerEntry.Kind.CHARGE,
            amount=0,
            key=f"charge:{batch_id}",
            batch_id=batch_id,
            memo=memo,
            at=now,
        ):
            return 0
        charged = LedgerEntry.objects.get(idempotency_key=f"charge:{batch_id}").amount_microusd
        if charged == 0 or not _append(
            org_id=org_id,
            kind=LedgerEntry.Kind.REFUND,
            amount=charged,
            key=f"refund:{batch_id}",
            batch_id=batch_id,
            memo=memo,
            at=now,
        ):
            return 0
        spend_record(
            org_id=org_id,
            revision_id=revision_id,
            deployment_id=deployment_id,
            amount_microusd=-charged,
            at=now,
            usage_class=usage_class,
        )
    logger.info("interactive %s refunded %s µUSD after an error answer", batch_id, charged)
    return charged
