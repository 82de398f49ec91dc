"""Staff set a catalog model's interactive prices in the admin, and find an interactive
request's usage events (its receipt on the platform) filtered by class."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from batches.interactive.settle import interactive_settle
from inference.models import CatalogModel
from tests.batches.test_interactive_recovery import accepted_request, priced, succeeded

pytestmark = pytest.mark.django_db

__all__ = ["priced"]  # a fixture


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_superuser("staff", "staff@example.com", "pw"))
    return client


def _form(catalog_model: CatalogModel, **prices: int) -> dict[str, object]:
    return {
        "revision": catalog_model.revision_id,
        "batch_enabled": "on",
        "price_input": 100,
        "price_cached_input": 50,
        "price_output": 400,
        "batch_media": "[]",
        "price_input_interactive": 100,
        "price_cached_input_interactive": 50,
        "price_output_interactive": 400,
        "enabled": "on",
        **prices,
    }


def test_the_admin_sets_interactive_prices_on_create_and_change(staff, catalog_model):
    staff.post(
        "/admin/inference/catalogmodel/add/",
        {"name": "boardwalk/other", **_form(catalog_model, price_input_interactive=300)},
    )
    created = CatalogModel.objects.get(name="boardwalk/other")
    assert created.price_input_interactive == 300 and created.price_input == 100
    staff.post(
        f"/admin/inference/catalogmodel/{created.pk}/change/",
        _form(
            catalog_model,
            price_input_interactive=310,
            price_cached_input_interactive=150,
            price_output_interactive=1_200,
        ),
    )
    created.refresh_from_db()
    assert (
        created.price_input_interactive,
        created.price_cached_input_interactive,
        created.price_output_interactive,
    ) == (310, 150, 1_200)
    assert created.price_output == 400  # the batch prices are their own


def test_the_admin_refuses_interactive_prices_below_the_batch_ones(staff, catalog_model):
    cheaper = _form(catalog_model, price_cached_input_interactive=49)
    response = staff.post("/admin/inference/catalogmodel/add/", {"name": "acme/x", **cheaper})
    assert response.status_code == 200
    assert "at least the batch price" in response.content.decode()
    assert not CatalogModel.objects.filter(name="acme/x").exists()
    response = staff.post(
        f"/admin/inference/catalogmodel/{catalog_model.pk}/change/", {"name": "x", **cheaper}
    )
    assert response.status_code == 200 and "at least the batch price" in response.content.decode()
    catalog_model.refresh_from_db()
    assert catalog_model.price_cached_input_interactive != 49


def test_blank_interactive_prices_take_a_model_off_interactive(staff, catalog_model):
    blank = {name: "" for name in ("price_input_interactive", "price_cached_input_interactive",
                                   "price_output_interactive")}  # fmt: skip
    staff.post(
        f"/admin/inference/catalogmodel/{catalog_model.pk}/change/", _form(catalog_model, **blank)
    )
    catalog_model.refresh_from_db()
    assert catalog_model.interactive_prices is None and catalog_model.batch_enabled
    half = _form(catalog_model, price_input_interactive="")
    response = staff.post(f"/admin/inference/catalogmodel/{catalog_model.pk}/change/", half)
    assert "all three interactive prices" in response.content.decode()


def test_the_usage_event_admin_shows_interactive_requests_by_class(staff, tenant, priced):
    accepted = accepted_request(tenant)
    interactive_settle(accepted.submitted, succeeded(accepted), revision_id=accepted.revision_id)
    interactive = staff.get("/admin/billing/usageevent/?usage_class__exact=interactive")
    assert interactive.status_code == 200 and accepted.submitted.id in interactive.content.decode()
    # In its own column, request_id (batch_id names batches only).
    request_cell = f'<td class="field-request_id">{accepted.submitted.id}</td>'
    assert request_cell in interactive.content.decode()
    batch = staff.get("/admin/billing/usageevent/?usage_class__exact=batch")
    assert accepted.submitted.id not in batch.content.decode()
    ledger = staff.get(f"/admin/billing/ledgerentry/?q={accepted.submitted.id}").content.decode()
    assert ledger.count(request_cell) == 3  # its hold, its release and its charge
