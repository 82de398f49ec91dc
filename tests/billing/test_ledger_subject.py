"""A ledger entry or usage event is about one subject: a batch (`batch_id`) or an interactive
request (`request_id`), never both, and a usage event always one of them (billing/models.py).
A caller naming neither or both is refused before anything is written, and the database
refuses such a row from any other path."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from billing.models import LedgerEntry, UsageEvent
from billing.services import credit_hold, credit_settle
from tests.conftest import Tenant

pytestmark = pytest.mark.django_db

BOTH = {"batch_id": "batch_x", "request_id": "req_x"}


@pytest.mark.parametrize("ids", [{}, BOTH], ids=["neither", "both"])
def test_a_hold_or_settle_naming_neither_or_both_subjects_writes_nothing(
    tenant: Tenant, ids: dict[str, str]
) -> None:
    before = LedgerEntry.objects.count()
    with pytest.raises(ValueError, match="one batch or one interactive request"):
        credit_hold(org_id=tenant.org.id, amount_microusd=100, **ids)
    with pytest.raises(ValueError, match="one batch or one interactive request"):
        credit_settle(org_id=tenant.org.id, charge_microusd=5, revision_id="mrev_x", **ids)
    assert LedgerEntry.objects.count() == before


def test_the_database_refuses_a_ledger_entry_about_a_batch_and_a_request(tenant: Tenant) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerEntry.objects.create(
            org=tenant.org, kind="hold", amount_microusd=1, idempotency_key="hold:x", **BOTH
        )
    assert not LedgerEntry.objects.filter(idempotency_key="hold:x").exists()


@pytest.mark.parametrize("ids", [{}, BOTH], ids=["neither", "both"])
def test_the_database_refuses_a_usage_event_without_exactly_one_subject(
    tenant: Tenant, ids: dict[str, str]
) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        UsageEvent.objects.create(
            org=tenant.org,
            item_id=1,
            attempt=1,
            revision_id="mrev_x",
            kind="input_tokens",
            quantity=3,
            **ids,
        )
    assert not UsageEvent.objects.exists()
