"""A seeded set of batches across two organizations and both billing kinds, and staff."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User

from batches.models import Batch
from tests.batches.conftest import finalize, rows, run_worker, submit
from tests.conftest import Tenant


@pytest.fixture
def staff(client: Any) -> Any:
    user = User.objects.create_superuser("staff", "staff@example.com", "pw")
    client.force_login(user)
    return client


@dataclass
class Seeded:
    acme: Tenant
    globex: Tenant
    batches: list[Batch]


def run_batch(tenant: Tenant, n: int, key: str, **body: Any) -> Batch:
    data = submit(tenant.api, rows(n, **body), key=key)
    run_worker(data["id"])
    batch = finalize(data["id"])
    assert batch is not None and batch.status == "completed"
    return batch


@pytest.fixture
def seeded(tenant: Tenant, other_tenant: Tenant, catalog_model: Any, deployment: Any) -> Seeded:
    """acme: a catalog batch and a deployment batch; globex: a catalog batch."""
    batches = [
        run_batch(tenant, 3, "acme-catalog"),
        run_batch(tenant, 2, "acme-deployment", model=deployment.name),
        run_batch(other_tenant, 2, "globex-catalog"),
    ]
    return Seeded(acme=tenant, globex=other_tenant, batches=batches)
