"""Interactive requests pay interactive prices, which an operator sets: a catalog model
without them, or a disabled model, refuses interactive requests with a 400 that says what
the operator must do, and holds nothing; flex never costs more than the default tier."""

from __future__ import annotations

from typing import Any

import pytest

from batches.interactive.messages import headroom_gauge
from batches.interactive.service import interactive_accept
from billing.models import LedgerEntry
from boardwalk.channels import channels
from inference.models import CatalogModel
from inference.services import catalog_model_update, model_set_enabled
from tests.conftest import INTERACTIVE_PRICES, PRICES, Api, Tenant

pytestmark = pytest.mark.django_db

BODY = {
    "model": "boardwalk/tiny-chat",
    "messages": [{"role": "user", "content": "Hello there"}],
    "max_completion_tokens": 8,
}


def _refused(api: Api, body: dict[str, Any], *, status: int = 400) -> dict[str, Any]:
    response = api.post("/v1/chat/completions", body)
    assert response.status_code == status, response.content
    assert response["x-should-retry"] == "false"
    assert not LedgerEntry.objects.filter(kind=LedgerEntry.Kind.HOLD).exists()
    return response.json()["error"]


def test_a_model_without_interactive_prices_refuses_interactive_requests(
    api: Api, catalog_model: CatalogModel
):
    catalog_model_update(model=catalog_model, prices=PRICES, media=[], interactive_prices=None)
    for tier in ("default", "flex"):
        error = _refused(api, BODY | {"service_tier": tier})
        assert error["type"] == "invalid_request_error"
        assert error["code"] == "model_not_interactive" and error["param"] == "model"
        assert "boardwalk/tiny-chat" in error["message"]
        assert "model set-price" in error["message"]  # what the operator must do


def test_a_disabled_model_refuses_interactive_requests_until_enabled(
    api: Api, tenant: Tenant, catalog_model: CatalogModel
):
    model_set_enabled(target=catalog_model, enabled=False)
    error = _refused(api, BODY)
    assert error["code"] == "model_disabled" and "model enable" in error["message"]
    assert "not available for batch" not in error["message"]
    model_set_enabled(target=catalog_model, enabled=True)
    accepted = interactive_accept(org=tenant.org, data=dict(BODY))
    accepted.admission.release()
    assert accepted.submitted.prices == list(INTERACTIVE_PRICES)


def test_a_disabled_deployment_refuses_interactive_requests(api: Api, deployment):
    model_set_enabled(target=deployment, enabled=False)
    error = _refused(api, BODY | {"model": deployment.name})
    assert error["code"] == "model_disabled" and deployment.name in error["message"]


def test_an_unknown_model_is_still_404(api: Api, catalog_model: CatalogModel):
    error = _refused(api, BODY | {"model": "acme/none"}, status=404)
    assert error["code"] == "model_not_found"


def test_flex_is_refused_on_a_model_not_offered_for_batch(api: Api, catalog_model):
    catalog_model_update(
        model=catalog_model, prices=None, media=[], interactive_prices=INTERACTIVE_PRICES
    )
    error = _refused(api, BODY | {"service_tier": "flex"})
    assert error["param"] == "service_tier" and "default" in error["message"]


def test_default_pays_interactive_prices_and_flex_the_lower_batch_prices(
    tenant: Tenant, catalog_model: CatalogModel
):
    default = interactive_accept(org=tenant.org, data=dict(BODY))
    default.admission.release()
    # A worker serving the revision reported a free row: flex runs now.
    channels().gauge(headroom_gauge(default.key), "worker-a", 1, ttl=30)
    flex = interactive_accept(org=tenant.org, data=BODY | {"service_tier": "flex"})
    flex.admission.release()
    assert default.submitted.prices == list(INTERACTIVE_PRICES)
    assert flex.submitted.prices == list(PRICES)
    assert all(f <= d for f, d in zip(flex.submitted.prices, default.submitted.prices, strict=True))
    holds = {
        entry.request_id: entry.amount_microusd
        for entry in LedgerEntry.objects.filter(kind=LedgerEntry.Kind.HOLD)
    }
    assert 0 < holds[flex.submitted.id] <= holds[default.submitted.id]  # never free
