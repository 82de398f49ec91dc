"""The usage dashboard's numbers are the ledger's and the receipts' (SPEC §8, §12)."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from django.db.models import Sum

from batches.models import BatchItem
from billing.models import LedgerEntry, UsageEvent
from console.selectors import Period, usage_dashboard
from tests.console.conftest import Seeded

pytestmark = pytest.mark.django_db


def _receipts(seeded_tenant: Any) -> list[dict[str, Any]]:
    response = seeded_tenant.api.get("/v1/requests?limit=100")
    assert response.status_code == 200, response.content
    return response.json()["data"]


def _ledger_charges(org_id: str) -> int:
    total = LedgerEntry.objects.filter(org_id=org_id, kind="charge").aggregate(
        s=Sum("amount_microusd")
    )["s"]
    return int(total or 0)


def test_dashboard_numbers_equal_the_ledger_and_the_receipts(seeded: Seeded, deployment):
    dashboard = usage_dashboard(period=Period.WEEK)
    by_org = {row.org_id: row for row in dashboard.by_org}
    assert set(by_org) == {seeded.acme.org.id, seeded.globex.org.id}
    for tenant in (seeded.acme, seeded.globex):
        row = by_org[tenant.org.id]
        receipts = _receipts(tenant)
        assert row.spend_microusd == _ledger_charges(tenant.org.id) > 0
        assert row.spend_microusd == sum(int(r["charge_microusd"]) for r in receipts)
        assert row.input_tokens == sum(r["usage"]["prompt_tokens"] for r in receipts)
        assert row.output_tokens == sum(r["usage"]["completion_tokens"] for r in receipts)
        cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in receipts)
        assert row.cached_tokens == cached
        assert row.items_succeeded == len(receipts)
    assert dashboard.total.spend_microusd == sum(
        _ledger_charges(t.org.id) for t in (seeded.acme, seeded.globex)
    )
    # The deployment row is GPU time only, priced from the events' integer microseconds.
    models = {row.key: row for row in dashboard.by_model}
    dep = models[(deployment.revision_id, deployment.id)]
    gpu_events = UsageEvent.objects.filter(deployment_id=deployment.id, kind="gpu_microseconds")
    assert dep.gpu_microseconds == gpu_events.aggregate(s=Sum("quantity"))["s"] > 0
    deployment_batch = seeded.batches[1]
    assert dep.spend_microusd == deployment_batch.charge_microusd
    assert (
        dep.spend_microusd
        == (
            BatchItem.objects.filter(batch=deployment_batch).aggregate(s=Sum("charge_microusd"))[
                "s"
            ]
        )
    )
    assert dep.label == "support-agent (deployment)"
    assert dashboard.batches_by_status == {"completed": 3}
    assert dashboard.queue.pending_items == 0


def test_the_page_shows_the_numbers_beside_the_charts(staff, seeded: Seeded):
    response = staff.get("/admin/usage/?period=day")
    assert response.status_code == 200
    page = response.content.decode()
    total = usage_dashboard(period=Period.DAY).total
    assert f'id="kpi-spend">{total.spend_microusd}<' in page
    assert f'id="kpi-input">{total.input_tokens}<' in page
    assert page.count("new Chartkick[o.type]") >= 6
    assert "/static/chartkick/Chart.bundle.js" in page and "cdn" not in page.lower()


def test_drill_down_shows_one_organization(staff, seeded: Seeded):
    response = staff.get(f"/admin/usage/?period=month&org={seeded.globex.org.id}")
    assert response.status_code == 200
    dashboard = response.context["d"]
    assert [row.org_id for row in dashboard.by_org] == [seeded.globex.org.id]
    assert dashboard.total.spend_microusd == _ledger_charges(seeded.globex.org.id)
    assert staff.get("/admin/usage/?org=org_nope").status_code == 404


def test_csv_export_is_the_table(staff, seeded: Seeded):
    response = staff.get("/admin/usage.csv?period=week")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert len(table) == 3  # acme catalog, acme deployment, globex catalog
    assert sum(int(r["spend_microusd"]) for r in table) == sum(
        _ledger_charges(t.org.id) for t in (seeded.acme, seeded.globex)
    )
    assert {r["model"] for r in table} == {"boardwalk/tiny-chat", "support-agent (deployment)"}


def test_dashboard_query_count_is_bounded(staff, seeded: Seeded, django_assert_max_num_queries):
    with django_assert_max_num_queries(20):
        assert staff.get("/admin/usage/?period=month").status_code == 200
    with django_assert_max_num_queries(20):
        assert staff.get(f"/admin/usage/?org={seeded.acme.org.id}").status_code == 200


def test_admin_index_links_the_console(staff):
    page = staff.get("/admin/").content.decode()
    assert 'href="/admin/usage/"' in page and 'href="/admin/workers/"' in page


def test_the_chart_assets_are_served_by_the_app_itself(client):
    # No CDN and no separate web server: `make run` serves them (WhiteNoise).
    for asset in ("/static/chartkick/Chart.bundle.js", "/static/chartkick/chartkick.js"):
        response = client.get(asset)
        assert response.status_code == 200, asset
        assert b"".join(response.streaming_content)[:1]
