from __future__ import annotations

import pytest

from boardwalk.errors import Conflict
from inference.services import deployment_create
from tests.conftest import PRICES, Api, Tenant

pytestmark = pytest.mark.django_db


def test_models_lists_catalog_and_own_deployments_only(api: Api, other_tenant: Tenant, deployment):
    deployment_create(
        org=other_tenant.org, name="their-agent", revision=deployment.revision, gpu_second_price=1
    )
    data = api.get("/v1/models").json()
    assert data["object"] == "list"
    by_id = {m["id"]: m for m in data["data"]}
    assert set(by_id) == {"boardwalk/tiny-chat", "support-agent"}
    catalog = by_id["boardwalk/tiny-chat"]
    assert catalog["object"] == "model" and catalog["kind"] == "catalog"
    assert catalog["owned_by"] == "boardwalk"
    assert catalog["model_config_id"].startswith("mcfg_")
    assert catalog["batch"] == {
        "unit": "microusd_per_million_tokens",
        "input": str(PRICES[0]),
        "cached_input": str(PRICES[1]),
        "output": str(PRICES[2]),
        "media": [],
    }
    own = by_id["support-agent"]
    assert (
        own["kind"] == "deployment"
        and own["owned_by"] == deployment.org_id
        and own["batch"] is None
    )


def test_model_detail_and_404_for_other_orgs_deployment(api: Api, other_tenant: Tenant, deployment):
    assert api.get("/v1/models/boardwalk/tiny-chat").json()["id"] == "boardwalk/tiny-chat"
    assert api.get("/v1/models/support-agent").json()["kind"] == "deployment"
    response = other_tenant.api.get("/v1/models/support-agent")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_names_are_unique_across_catalog_and_deployments(tenant: Tenant, deployment):
    with pytest.raises(Conflict):
        deployment_create(
            org=tenant.org,
            name="boardwalk/tiny-chat",
            revision=deployment.revision,
            gpu_second_price=1,
        )
