"""Writes to the credit ledger. Every entry is keyed, so a retry can never double-count."""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from billing.metering import UsageClass, spend_record
from billing.models import LedgerEntry
from boardwalk import clock
from boardwalk.codes import ErrorCode
from boardwalk.errors import InvalidRequest
from boardwalk.models import Organization

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Subject:
    """What a hold, release, charge or refund is about: a batch, or an interactive request.

    The ledger keeps them in their own columns (`batch_id`, `request_id`); the entry's key
    names whichever it is (`hold:batch_…`, `charge:req_…`)."""

    batch_id: str = ""
    request_id: str = ""

    def __post_init__(self) -> None:
        if bool(self.batch_id) == bool(self.request_id):
            raise ValueError("a ledger subject is one batch or one interactive request")

    @property
    def id(self) -> str:
        return self.batch_id or self.request_id


def _append(
    *,
    org_id: str,
    kind: str,
    amount: int,
    key: str,
    subject: Subject | None = None,
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
                batch_id=subject.batch_id if subject else "",
                request_id=subject.request_id if subject else "",
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


def credit_hold(
    *, org_id: str, amount_microusd: int, batch_id: str = "", request_id: str = ""
) -> None:
    """Reserve credit for a batch or an interactive request (exactly one of the two). Caller
    holds the org row lock and checked availability."""
    subject = Subject(batch_id, request_id)
    _append(
        org_id=org_id,
        kind=LedgerEntry.Kind.HOLD,
        amount=amount_microusd,
        key=f"hold:{subject.id}",
        subject=subject,
    )


def _hold_release(*, org_id: str, subject: Subject) -> None:
    """Append the release of the batch's (or request's) hold, if it has one; once."""
    hold = LedgerEntry.objects.filter(idempotency_key=f"hold:{subject.id}").first()
    if hold is not None:
        _append(
            org_id=org_id,
            kind=LedgerEntry.Kind.RELEASE,
            amount=hold.amount_microusd,
            key=f"release:{subject.id}",
            subject=subject,
        )


def credit_settle(
    *,
    org_id: str,
    charge_microusd: int,
    revision_id: str,
    deployment_id: str = "",
    usage_class: UsageClass = "batch",
    batch_id: str = "",
    request_id: str = "",
) -> None:
    """Replace a batch's (or an interactive request's: exactly one of the two ids) hold by its
    actual charge; safe to call any number of times.

    The charge is added to the usage rollup (the dashboard's spend) only when its ledger
    entry is appended, in the same transaction: spend and ledger cannot disagree.
    """
    subject = Subject(batch_id, request_id)
    now = clock.now()
    with transaction.atomic():
        _hold_release(org_id=org_id, subject=subject)
        if charge_microusd > 0 and _append(
            org_id=org_id,
            kind=LedgerEntry.Kind.CHARGE,
            amount=charge_microusd,
            key=f"charge:{subject.id}",
            subject=subject,
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
    request_id: str,
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
    subject = Subject(request_id=request_id)
    now = clock.now()
    with transaction.atomic():
        _hold_release(org_id=org_id, subject=subject)
        if _append(
            org_id=org_id,
            kind=LedgerEntry.Kind.CHARGE,
            amount=0,
            key=f"charge:{request_id}",
            subject=subject,
            memo=memo,
            at=now,
        ):
            return 0
        charged = LedgerEntry.objects.get(idempotency_key=f"charge:{request_id}").amount_microusd
        if charged == 0 or not _append(
            org_id=org_id,
            kind=LedgerEntry.Kind.REFUND,
            amount=charged,
            key=f"refund:{request_id}",
            subject=subject,
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
    logger.info("interactive %s refunded %s µUSD after an error answer", request_id, charged)
    return charged
