"""The staff console renders every model and never shows content
(docs/API.md "Limits, retention and privacy")."""

from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import User
from django.urls import reverse

from batches.models import Batch
from billing.selectors import credit_for_org
from boardwalk.models import ApiKey
from files.models import File
from tests.batches.conftest import finalize, run_worker, submit
from tests.conftest import Api, Tenant, request_line

pytestmark = pytest.mark.django_db
MARKER = "SECRET-PROMPT-CONTENT-93b1"


@pytest.fixture
def staff(client):
    user = User.objects.create_superuser("staff", "staff@example.com", "pw")
    client.force_login(user)
    return client


def test_admin_pages_render_without_content(staff, api: Api, catalog_model):
    data = submit(api, [request_line("a", content=MARKER)])
    run_worker(data["id"])
    batch = finalize(data["id"])
    pages = [
        "/admin/",
        "/admin/boardwalk/organization/",
        "/admin/boardwalk/apikey/",
        "/admin/inference/catalogmodel/",
        "/admin/inference/modelrevision/",
        "/admin/inference/deployment/",
        "/admin/billing/ledgerentry/",
        "/admin/batches/batch/",
        reverse("admin:batches_batch_change", args=[quote(batch.id)]),
        "/admin/files/file/",
        reverse("admin:files_file_change", args=[quote(batch.output_file_id)]),
    ]
    for page in pages:
        response = staff.get(page)
        assert response.status_code == 200, page
        assert MARKER not in response.content.decode(), page


def test_admin_creates_a_key_showing_the_secret_once(staff, tenant: Tenant):
    response = staff.post(
        "/admin/boardwalk/apikey/add/",
        {"org": tenant.org.pk, "name": "ci", "scopes": ["requests:read"]},
        follow=True,
    )
    assert response.status_code == 200
    key = ApiKey.objects.get(name="ci")
    shown = [str(m) for m in response.context["messages"]]
    assert any("bw_" + key.prefix in m for m in shown)
    assert key.scopes == ["requests:read"]


def test_admin_grants_credit_through_the_ledger(staff, tenant: Tenant):
    before = credit_for_org(org_id=tenant.org.id).balance
    staff.post(
        "/admin/billing/ledgerentry/add/",
        {"org": tenant.org.pk, "amount_microusd": 5000, "memo": "support"},
    )
    assert credit_for_org(org_id=tenant.org.id).balance == before + 5000


def test_admin_cannot_edit_batches_or_files(staff, api: Api, catalog_model):
    data = submit(api, [request_line("a")])
    assert staff.post(reverse("admin:batches_batch_delete", args=[data["id"]])).status_code == 403
    assert Batch.objects.filter(id=data["id"]).exists()
    assert staff.get("/admin/files/file/add/").status_code == 403
    assert File.objects.count() == 1
