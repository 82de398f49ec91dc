"""Every staff page: refused to everyone but staff, free of content, bounded in queries."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.text import capfirst

from batches.models import Batch, BatchItem
from boardwalk.models import ApiKey
from inference.models import CatalogModel, Deployment
from tests.batches.conftest import finalize, run_worker, submit
from tests.conftest import Api, Tenant, content_of, make_tenant, parse_jsonl, request_line

pytestmark = pytest.mark.django_db
MARKER = "MARKER-PROMPT-7f3c2a91-never-in-the-admin"
CONSOLE_PAGES = ["/admin/usage/", "/admin/usage/?period=day", "/admin/usage.csv", "/admin/workers/"]


def admin_pages() -> list[str]:
    """The admin index, the console, and every registered model's list, add and change pages
    (every row's change page: the tests seed few)."""
    pages = ["/admin/", *CONSOLE_PAGES]
    for model, model_admin in admin.site._registry.items():
        meta = model._meta
        base = f"admin:{meta.app_label}_{meta.model_name}"
        pages.append(reverse(f"{base}_changelist"))
        pages.append(reverse(f"{base}_add"))
        for pk in model_admin.get_queryset(None).values_list("pk", flat=True)[:50]:  # type: ignore[arg-type]
            # Quoted as the admin's own links are: "_" is its escape character, so an id
            # such as batch_5Fx… unquotes to another id (and 302s) when sent as it is.
            pages.append(reverse(f"{base}_change", args=[quote(pk)]))
    return pages


@pytest.fixture
def marked_batch(api: Api, catalog_model) -> tuple[Batch, str]:
    """A batch that really generated text, with MARKER in its prompt; returns the completion."""
    data = submit(api, [request_line("marked", content=f"Say {MARKER} back to me")])
    run_worker(data["id"])
    batch = finalize(data["id"])
    assert batch is not None and batch.status == "completed"
    output = parse_jsonl(content_of(api.get(f"/v1/files/{batch.output_file_id}/content")))
    completion = output[0]["response"]["body"]["choices"][0]["message"]["content"]
    return batch, completion


def test_no_admin_page_shows_prompt_or_completion_content(staff, marked_batch, deployment):
    batch, completion = marked_batch
    assert BatchItem.objects.filter(batch=batch, state="succeeded").exists()
    pages = admin_pages()
    assert len(pages) > 30
    for page in pages:
        response = staff.get(page)
        assert response.status_code in (200, 403), page  # 403: read-only models' add pages
        body = content_of(response).decode()
        assert MARKER not in body, page
        if len(completion) >= 12:
            assert completion not in body, page


@pytest.mark.parametrize("who", ["anonymous", "non_staff", "api_key"])
def test_every_admin_page_refuses_all_but_staff(who: str, tenant: Tenant, deployment):
    client = Client()
    headers: dict[str, str] = {}
    if who == "non_staff":
        client.force_login(User.objects.create_user("user", "user@example.com", "pw"))
    elif who == "api_key":
        headers = {"HTTP_AUTHORIZATION": f"Bearer {tenant.write_key}"}
    for page in admin_pages():
        response = client.get(page, **headers)
        assert response.status_code == 302, (who, page)
        assert response["Location"].startswith("/admin/login/"), (who, page)
        assert client.post(page, {}, **headers).status_code in (302, 403), (who, page)


def _queries(client: Any, page: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(page).status_code == 200, page
    return len(captured)


def test_list_pages_do_not_query_per_row(staff, api: Api, catalog_model, deployment):
    submit(api, [request_line("a")], key="one")
    lists = [
        reverse(f"admin:{m._meta.app_label}_{m._meta.model_name}_changelist")
        for m in admin.site._registry
    ]
    few = {page: _queries(staff, page) for page in lists}
    for i in range(6):
        tenant = make_tenant(f"org-{i}")
        Deployment.objects.create(
            org=tenant.org, name=f"dep-{i}", revision=catalog_model.revision, gpu_second_price=1
        )
        submit(tenant.api, [request_line("a")], key=f"k{i}")
    assert ApiKey.objects.count() > 12 and Batch.objects.count() == 7
    assert CatalogModel.objects.count() == 1
    for page in lists:
        assert _queries(staff, page) <= few[page] + 1, page  # +1: a filter list may grow
        assert few[page] <= 12, page


def test_the_admin_creates_catalog_models_and_deployments_through_the_services(
    staff, tenant: Tenant, catalog_model
):
    taken = staff.post(
        "/admin/inference/deployment/add/",
        {
            "name": catalog_model.name,
            "org": tenant.org.pk,
            "revision": catalog_model.revision_id,
            "gpu_second_price": 5,
        },
    )
    assert taken.status_code == 200  # the form again, with the error
    assert "already used" in taken.content.decode()
    assert not Deployment.objects.exists()
    staff.post(
        "/admin/inference/deployment/add/",
        {
            "name": "private-one",
            "org": tenant.org.pk,
            "revision": catalog_model.revision_id,
            "gpu_second_price": 5,
        },
    )
    assert Deployment.objects.get(name="private-one").org == tenant.org
    again = staff.post(
        "/admin/inference/catalogmodel/add/",
        {
            "name": "private-one",
            "revision": catalog_model.revision_id,
            "batch_enabled": "on",
            "price_input": 1,
            "price_cached_input": 1,
            "price_output": 1,
            "batch_media": "[]",
        },
    )
    assert "already used" in again.content.decode()
    assert CatalogModel.objects.count() == 1


def test_the_grant_action_credits_each_selected_org_through_the_ledger(staff, tenant: Tenant):
    from billing.selectors import credit_for_org

    before = credit_for_org(org_id=tenant.org.id).balance
    form = staff.post(
        "/admin/boardwalk/organization/",
        {"action": "grant_credit", "_selected_action": [tenant.org.pk]},
    )
    assert form.status_code == 200 and "Grant credit" in form.content.decode()
    staff.post(
        "/admin/boardwalk/organization/",
        {
            "action": "grant_credit",
            "_selected_action": [tenant.org.pk],
            "apply": "Grant",
            "amount_microusd": 7000,
            "memo": "support ticket 12",
        },
    )
    assert credit_for_org(org_id=tenant.org.id).balance == before + 7000


def test_the_workers_view_shows_live_processes_and_their_leases(staff, api: Api, catalog_model):
    from batches.liveness import worker_beat
    from batches.queue import EngineKey, items_claim

    data = submit(api, [request_line("a"), request_line("b")])
    batch = Batch.objects.get(id=data["id"])
    worker_beat(process="host-a:1:aa")
    items_claim(key=EngineKey(batch.revision_id), worker_id="host-a:1:aa:77", limit=2)
    page = staff.get("/admin/workers/")
    workers = page.context["workers"]
    assert [(w.id, w.alive, w.leases) for w in workers] == [("host-a:1:aa", True, 2)]


def test_every_model_in_the_sidebar_has_a_proper_plural(staff):
    """The admin's default plural adds an "s" ("Webhook deliverys"); each model that needs
    another sets verbose_name_plural."""
    page = staff.get("/admin/").content.decode()
    assert "Webhook deliveries" in page and "Ledger entries" in page
    for model in admin.site._registry:
        plural = str(model._meta.verbose_name_plural)
        assert not re.search(r"(?:[^aeiou]ys|[sxz]s|[cs]hs)$", plural), plural
        assert capfirst(plural) in page, plural
