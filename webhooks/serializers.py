from __future__ import annotations

from typing import Any

from boardwalk import clock
from webhooks.models import WebhookEndpoint


def endpoint_payload(endpoint: WebhookEndpoint, *, secret: str | None = None) -> dict[str, Any]:
    """`WebhookEndpoint`, or `WebhookEndpointWithSecret` when given the secret (only from
    create and rotate_secret: docs/API.md "Webhooks")."""
    payload: dict[str, Any] = {
        "id": endpoint.id,
        "object": "webhook_endpoint",
        "name": endpoint.name,
        "url": endpoint.url,
        "event_types": list(endpoint.event_types),
        "signing_secret_hint": endpoint.secret_hint or None,
        "created_at": clock.unix(endpoint.created_at),
        "updated_at": clock.unix(endpoint.updated_at),
    }
    if secret is not None:
        payload["signing_secret"] = secret
    return payload


def deleted_payload(endpoint_id: str) -> dict[str, Any]:
    return {"id": endpoint_id, "object": "webhook_endpoint.deleted", "deleted": True}


def endpoint_test_payload(
    endpoint: WebhookEndpoint, *, event_type: str, status: int
) -> dict[str, Any]:
    """`WebhookEndpointTestResult`: `success` is always true once an answer came back; the
    endpoint's own verdict is `status_code`."""
    return {
        "object": "webhook_endpoint.test",
        "webhook_endpoint_id": endpoint.id,
        "event_type": event_type,
        "status_code": status,
        "success": True,
    }
