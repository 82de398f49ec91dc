"""/metrics reports the interactive tier per revision beside the batch gauges: requests
waiting for a worker, requests running, rows free."""

from __future__ import annotations

import pytest
from django.test import Client

from batches.interactive.messages import headroom_gauge, in_flight_gauge, request_channel
from batches.queue import EngineKey
from boardwalk.channels import channels
from boardwalk.metrics import labels_text

pytestmark = pytest.mark.django_db


def samples(client: Client) -> dict[str, float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    out = {}
    for line in response.content.decode().splitlines():
        if not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_interactive_gauges_sum_each_revisions_keys(catalog_model, deployment):
    ch = channels()
    catalog_key = EngineKey(catalog_model.revision_id, "")
    deployment_key = EngineKey(deployment.revision_id, deployment.id)
    ch.push(request_channel(catalog_key), b"{}", ttl=30)
    ch.push(request_channel(deployment_key), b"{}", ttl=30)
    ch.gauge(in_flight_gauge(catalog_key), "worker-a", 2, ttl=30)
    ch.gauge(in_flight_gauge(catalog_key), "worker-b", 1, ttl=30)
    ch.gauge(headroom_gauge(deployment_key), "worker-a", 5, ttl=30)
    try:
        seen = samples(Client())
    finally:
        for key in (catalog_key, deployment_key):
            for name in (request_channel(key), in_flight_gauge(key), headroom_gauge(key)):
                ch.delete(name)
    label = "{" + labels_text({"revision": catalog_model.revision_id}) + "}"
    # The catalog model and the deployment serve one revision: one sample each, summed.
    assert seen["boardwalk_interactive_queued" + label] == 2
    assert seen["boardwalk_interactive_in_flight" + label] == 3
    assert seen["boardwalk_interactive_free_rows" + label] == 5
    assert deployment.id not in "".join(seen)  # labels name revisions only
    assert any(name.startswith("boardwalk_batches{") for name in seen)  # batch's as before
