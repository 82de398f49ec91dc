"""Reasoning tokens as a detail of the output tokens: their own event kind and rollup column,
written once with the rest of an attempt's usage, and shown to staff next to output tokens."""

from __future__ import annotations

import csv
import io

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from billing.metering import Outcome, UsageFacts, usage_record
from billing.models import UsageEvent, UsageRollup
from console.selectors import Period, usage_dashboard
from tests.conftest import Tenant

pytestmark = pytest.mark.django_db


def _facts(tenant: Tenant, *, item_id: int, outcome: Outcome = "succeeded") -> UsageFacts:
    return UsageFacts(
        org_id=tenant.org.id,
        batch_id="batch_reasoning",
        item_id=item_id,
        attempt=1,
        revision_id="rev_reasoning",
        deployment_id="",
        outcome=outcome,
        prompt_tokens=5,
        completion_tokens=12,
        reasoning_tokens=8,
        gpu_microseconds=10,
    )


def _reasoning(item_id: int) -> list[int]:
    return list(
        UsageEvent.objects.filter(item_id=item_id, kind="reasoning_tokens").values_list(
            "quantity", flat=True
        )
    )


def test_reasoning_is_metered_once_as_a_detail_of_the_output(tenant: Tenant):
    facts = _facts(tenant, item_id=1)
    usage_record(facts=[facts])
    with pytest.raises(IntegrityError), transaction.atomic():
        usage_record(facts=[facts])  # the same attempt again: refused, all of it
    assert _reasoning(1) == [8]
    rollup = UsageRollup.objects.get()
    assert (rollup.output_tokens, rollup.reasoning_tokens) == (12, 8)


@pytest.mark.parametrize(("outcome", "counted"), [("failed", 0), ("released", 0), ("cut", 8)])
def test_reasoning_counts_where_output_tokens_count(tenant: Tenant, outcome: Outcome, counted: int):
    usage_record(facts=[_facts(tenant, item_id=2, outcome=outcome)])
    assert sum(_reasoning(2)) == counted
    assert UsageRollup.objects.get().reasoning_tokens == counted


def test_staff_see_reasoning_next_to_output_tokens(client, tenant: Tenant):
    usage_record(facts=[_facts(tenant, item_id=3), _facts(tenant, item_id=4)])
    dashboard = usage_dashboard(period=Period.DAY)
    assert (dashboard.total.output_tokens, dashboard.total.reasoning_tokens) == (24, 16)
    [row] = dashboard.by_org_model
    assert row.reasoning_tokens == 16

    client.force_login(User.objects.create_superuser("staff", "staff@example.com", "pw"))
    table = list(csv.reader(io.StringIO(client.get("/admin/usage.csv?period=day").text)))
    header, line = table
    at = header.index("output_tokens")
    assert header[at + 1] == "reasoning_tokens"
    assert (line[at], line[at + 1]) == ("24", "16")
    page = client.get("/admin/usage/?period=day").content.decode()
    assert '<th class="n">reasoning</th>' in page
