"""billing 0007 moves interactive usage to its own column: every `req_…` that the ledger and
the usage events held in `batch_id` goes to `request_id` (batch_id left blank), and back on
the reverse; batches' rows and grants are not touched. A hold taken before the migration is
settled after it under the same keys."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from billing.models import LedgerEntry, UsageEvent
from billing.selectors import credit_for_org
from billing.services import credit_settle
from boardwalk import clock

BEFORE = [("billing", "0006_subject_request_id")]
REQUEST = "req_0123456789abcdef01234567"
BATCH = "batch_0123456789abcdef"


def _migrate(target: list[tuple[str, str]]) -> Any:
    """Migrate to `target` (fresh executor: the graph as the database has it now); the apps
    of that state."""
    executor = MigrationExecutor(connection)
    executor.migrate(target)
    return executor.loader.project_state(target).apps


def _latest() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes("billing")


def _old_rows(apps: Any, org_id: str) -> None:
    """What the code wrote before 0007: the request's id in batch_id."""
    Ledger = apps.get_model("billing", "LedgerEntry")
    Event = apps.get_model("billing", "UsageEvent")
    now = clock.now()
    for kind, key, subject, amount in (
        ("grant", "grant:1", "", 10_000),
        ("hold", f"hold:{BATCH}", BATCH, 300),
        ("hold", f"hold:{REQUEST}", REQUEST, 500),
    ):
        Ledger.objects.create(
            org_id=org_id,
            kind=kind,
            amount_microusd=amount,
            batch_id=subject,
            idempotency_key=key,
            created_at=now,
        )
    for subject, item_id, usage_class in ((BATCH, 1, "batch"), (REQUEST, -7, "interactive")):
        Event.objects.create(
            org_id=org_id,
            batch_id=subject,
            item_id=item_id,
            attempt=0,
            revision_id="mcfg_x",
            kind="input_tokens",
            quantity=5,
            usage_class=usage_class,
            created_at=now,
        )


def _subjects(apps: Any, model: str) -> set[tuple[str, str, str]]:
    rows = apps.get_model("billing", model).objects.values_list("kind", "batch_id", "request_id")
    return set(rows)


@pytest.mark.django_db(transaction=True)
def test_request_ids_move_to_their_own_column_and_back(tenant):
    org_id = tenant.org.id
    try:
        old = _migrate(BEFORE)
        _old_rows(old, org_id)
        held = credit_for_org(org_id=org_id)

        new = _migrate(_latest())
        assert _subjects(new, "LedgerEntry") == {
            ("grant", "", ""),
            ("hold", BATCH, ""),
            ("hold", "", REQUEST),
        }
        assert _subjects(new, "UsageEvent") == {
            ("input_tokens", BATCH, ""),
            ("input_tokens", "", REQUEST),
        }
        assert credit_for_org(org_id=org_id) == held  # amounts, kinds and keys untouched

        back = _migrate(BEFORE)
        assert _subjects(back, "LedgerEntry") == {
            ("grant", "", ""),
            ("hold", BATCH, ""),
            ("hold", REQUEST, ""),
        }
        assert _subjects(back, "UsageEvent") == {
            ("input_tokens", BATCH, ""),
            ("input_tokens", REQUEST, ""),
        }
    finally:
        _migrate(_latest())


@pytest.mark.django_db(transaction=True)
def test_a_request_held_before_the_migration_is_settled_after_it_once(tenant):
    org_id = tenant.org.id
    try:
        _old_rows(_migrate(BEFORE), org_id)
        _migrate(_latest())
        before = credit_for_org(org_id=org_id)
        for _ in range(2):  # a retried settle appends nothing more
            credit_settle(
                org_id=org_id,
                request_id=REQUEST,
                charge_microusd=120,
                revision_id="mcfg_x",
                usage_class="interactive",
            )
        request = LedgerEntry.objects.filter(request_id=REQUEST)
        assert sorted(request.values_list("kind", "amount_microusd")) == [
            ("charge", 120),
            ("hold", 500),
            ("release", 500),
        ]
        assert not request.exclude(batch_id="").exists()
        credit = credit_for_org(org_id=org_id)
        assert (credit.balance, credit.held) == (before.balance - 120, before.held - 500)
        assert UsageEvent.objects.get(request_id=REQUEST).batch_id == ""
    finally:
        _migrate(_latest())
