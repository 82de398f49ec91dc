"""The usage dashboard's numbers are the ledger's and the receipts'
(docs/BILLING.md "The staff console")."""

from __future__ import annotations

import csv
import datetime as dt
import io
from pathlib import Path
from typing import Any

import pytest
from django.db.models import Sum

from batches.models import BatchItem, WorkerProcess
from batches.sweeps import sweep_work
from billing.metering import UsageFacts, usage_record
from billing.models import LedgerEntry, UsageEvent
from boardwalk import clock
from console.selectors import Period, usage_dashboard
from console.views import _cell
from inference.demo.model import demo_revision_fields
from inference.services import catalog_model_set_revision, revision_create
from tests.batches.conftest import finalize, rows, submit
from tests.console.conftest import Seeded, run_batch

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
    dep = models["support-agent (deployment)"]
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


def test_items_failed_and_the_failure_codes_count_the_items_stopped_batches_ended(
    staff, seeded: Seeded, catalog_model, deployment
):
    """Items a cancelled or expired batch never ran end failed with its code: "Items failed"
    and the failure chart count them with the items that ran and failed (docs/API.md "Billing")."""
    acme, globex = seeded.acme, seeded.globex
    cancelled = submit(acme.api, rows(3), key="to-cancel")
    assert acme.api.post(f"/v1/batches/{cancelled['id']}/cancel").status_code == 200
    assert finalize(cancelled["id"]).status == "cancelled"
    expiring = submit(globex.api, rows(2), key="to-expire")
    with clock.travel(dt.timedelta(hours=24, seconds=1)):
        sweep_work()
        assert finalize(expiring["id"]).status == "expired"
    # And items written so directly, as a stopped deployment batch leaves them (no usage
    # was metered for them: they never ran).
    stopped = submit(acme.api, rows(2, model=deployment.name), key="stopped-deployment")
    BatchItem.objects.filter(batch_id=stopped["id"]).update(
        state=BatchItem.State.FAILED, error_code="batch_cancelled", completed_at=clock.now()
    )
    assert not UsageEvent.objects.filter(batch_id__in=[cancelled["id"], stopped["id"]]).exists()

    dashboard = usage_dashboard(period=Period.WEEK)
    assert dashboard.failure_codes == {"batch_cancelled": 5, "batch_expired": 2}
    assert dashboard.total.items_failed == 7
    rows_by_key = {(r.org_id, r.key): r.items_failed for r in dashboard.by_org_model}
    assert rows_by_key == {
        (acme.org.id, catalog_model.name): 3,
        (acme.org.id, "support-agent (deployment)"): 2,
        (globex.org.id, catalog_model.name): 2,
    }
    assert {r.org_id: r.items_failed for r in dashboard.by_org} == {
        acme.org.id: 5,
        globex.org.id: 2,
    }
    # The items that never ran are no throughput.
    assert dashboard.items_stopped == 7
    ran = dashboard.total.items_succeeded
    assert dashboard.items_per_second == pytest.approx(ran / dashboard.seconds)
    # One organization's view counts its own only.
    assert usage_dashboard(period=Period.DAY, org=globex.org).failure_codes == {"batch_expired": 2}
    page = staff.get("/admin/usage/?period=week").content.decode()
    assert 'id="kpi-failed">7<' in page and "7 never ran" in page
    table = list(csv.DictReader(io.StringIO(staff.get("/admin/usage.csv").content.decode())))
    assert sum(int(r["items_failed"]) for r in table) == 7


def test_an_organization_with_only_stopped_work_has_its_row(tenant, catalog_model):
    """A batch cancelled before anything ran meters nothing; its failed items still show."""
    data = submit(tenant.api, rows(2), key="cancel-at-once")
    tenant.api.post(f"/v1/batches/{data['id']}/cancel")
    finalize(data["id"])
    dashboard = usage_dashboard(period=Period.DAY)
    assert [(r.label, r.items_failed, r.input_tokens) for r in dashboard.by_org_model] == [
        ("acme · boardwalk/tiny-chat", 2, 0)
    ]


def _usage(tenant: Any, revision_id: str, *, deployment_id: str = "", n: int, **facts: Any) -> None:
    """Metered usage as workers record it (the rollup the dashboard reads)."""
    subject = (
        {"request_id": f"req_{revision_id}_{n}"}
        if facts.get("usage_class") == "interactive"
        else {"batch_id": f"batch_{revision_id}_{n}"}
    )
    usage_record(
        facts=[
            UsageFacts(
                org_id=tenant.org.id,
                **subject,
                item_id=20_000_000 + n,
                attempt=1,
                revision_id=revision_id,
                deployment_id=deployment_id,
                outcome="succeeded",
                prompt_tokens=100,
                completion_tokens=10,
                **facts,
            )
        ]
    )


def test_one_model_is_one_row_across_its_revisions_and_both_classes(staff, tenant, catalog_model):
    """Batch rows of the revision the catalog served before, batch rows and interactive
    requests of the one it serves now: one model, one row, named as clients name it; the
    revision's label (a path by default) only where nothing names the revision."""
    before = catalog_model.revision
    run_batch(tenant, 2, "before")  # pinned to the first revision
    after = revision_create(
        **(demo_revision_fields(Path(before.weights), "tiny") | {"label": "tiny@/srv/models/b"})
    )
    catalog_model_set_revision(model=catalog_model, revision=after)
    run_batch(tenant, 1, "after")
    _usage(tenant, after.id, n=1, usage_class="interactive")
    orphan = revision_create(
        **(demo_revision_fields(Path(before.weights), "tiny") | {"label": "/srv/models/orphan"})
    )
    _usage(tenant, orphan.id, n=2)  # no catalog name, no batch, no deployment
    dashboard = usage_dashboard(period=Period.DAY)
    assert [r.label for r in dashboard.by_model] == ["/srv/models/orphan", catalog_model.name]
    model = dashboard.by_model[1]
    assert model.items_succeeded == 2 + 1 + 1
    assert model.input_tokens + 100 == dashboard.total.input_tokens
    [row, _] = sorted(dashboard.by_org_model, key=lambda r: r.key != catalog_model.name)
    assert row.label == f"acme · {catalog_model.name}"
    assert sorted(row.revisions) == sorted([(before.id, ""), (after.id, "")])
    page = staff.get("/admin/usage/?period=day").content.decode()
    assert "tiny@/srv/models/b" not in page and before.label not in page
    table = list(csv.DictReader(io.StringIO(staff.get("/admin/usage.csv?period=day").text)))
    [exported] = [r for r in table if r["model"] == catalog_model.name]
    assert sorted(exported["revision_id"].split()) == sorted([before.id, after.id])
    assert exported["deployment_id"] == ""
    assert int(exported["items_succeeded"]) == 4


def test_the_queue_and_the_workers_page_name_models_not_revisions(
    staff, tenant, catalog_model, deployment
):
    from batches.liveness import worker_beat

    submit(tenant.api, rows(3), key="queued-catalog")
    submit(tenant.api, rows(2, model=deployment.name), key="queued-deployment")
    queue = usage_dashboard(period=Period.DAY).queue
    assert queue.by_model == [(catalog_model.name, 3), ("support-agent (deployment)", 2)]
    page = staff.get("/admin/usage/?period=day").content.decode()
    assert f'<td>{catalog_model.name}</td><td class="n">3</td>' in page
    worker_beat(process="host-a:1:aa")
    WorkerProcess.objects.filter(id="host-a:1:aa").update(revisions=[catalog_model.revision_id])
    response = staff.get("/admin/workers/")
    [worker] = response.context["workers"]
    names = f"{catalog_model.name}, support-agent (deployment)"
    assert worker.revisions == [(catalog_model.revision_id, names)]
    assert f'<span title="{catalog_model.revision_id}">{names}</span>' in response.content.decode()


@pytest.mark.parametrize(
    "label", ['=HYPERLINK("https://x.test")', "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx"]
)
def test_csv_cells_a_spreadsheet_would_run_are_written_as_text(staff, tenant, catalog_model, label):
    """OWASP's advice for CSV injection: a text cell starting with = + - @ tab or CR gets a
    leading apostrophe; numbers stay numbers."""
    revision = revision_create(
        **(demo_revision_fields(Path(catalog_model.revision.weights), "tiny") | {"label": label})
    )
    _usage(tenant, revision.id, n=3)  # nothing names it: the row is named by its label
    table = list(csv.reader(io.StringIO(staff.get("/admin/usage.csv?period=day").text)))
    header, [row] = table[0], table[1:]
    assert row[header.index("model")] == "'" + label
    assert row[header.index("input_tokens")] == "100"
    assert not any(cell[:1] in ("=", "+", "-", "@", "\t", "\r") for cell in row)
    # A number is written as the number, a negative one too; text that looks like one is text.
    assert [_cell(-5), _cell(0), _cell("-5"), _cell("a=b")] == [-5, 0, "'-5", "a=b"]
