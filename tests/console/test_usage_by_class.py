"""The usage dashboard splits interactive requests from batch rows (the rollup's class), and
the two add up to its totals."""

from __future__ import annotations

import pytest

from batches.interactive.settle import interactive_settle
from billing.models import LedgerEntry
from console.selectors import SUMS, Period, usage_dashboard
from tests.batches.conftest import finalize, rows, run_worker, submit
from tests.batches.test_interactive_recovery import accepted_request, priced, succeeded

pytestmark = pytest.mark.django_db

__all__ = ["priced"]  # a fixture


def test_the_dashboard_splits_interactive_from_batch(staff, tenant, priced):
    submitted = submit(tenant.api, rows(2), key="by-class")
    run_worker(submitted["id"])
    finalize(submitted["id"])
    accepted = accepted_request(tenant)
    result = succeeded(accepted)
    charge = interactive_settle(accepted.submitted, result, revision_id=accepted.revision_id)
    assert charge > 0
    dashboard = usage_dashboard(period=Period.DAY)
    batch, interactive = dashboard.by_class
    assert (batch.label, interactive.label) == ("Batch", "Interactive")
    assert interactive.items_succeeded == 1 and batch.items_succeeded == 2
    assert interactive.input_tokens == result.prompt_tokens
    assert interactive.output_tokens == result.completion_tokens
    assert interactive.spend_microusd == charge
    batch_charges = LedgerEntry.objects.filter(kind="charge", batch_id=submitted["id"])
    assert batch.spend_microusd == sum(e.amount_microusd for e in batch_charges) > 0
    for name in SUMS:
        assert getattr(batch, name) + getattr(interactive, name) == getattr(dashboard.total, name)
    page = staff.get("/admin/usage/?period=day").content.decode()
    assert 'id="usage-by-class"' in page and "Interactive" in page
