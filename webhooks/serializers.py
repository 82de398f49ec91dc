from __future__ import annotations

from typing import Any

from boardwalk import clock
from webhooks.models import WebhookEndpoint


def endpoint_payload(endpoint: WebhookEndpoint, *, secret: str | None = None) -> dict[str, Any]:
    """The endpoint object; `secret` only in the creation answer (SPEC §10b)."""
    payload: dict[str, Any] = {
        "id": endpoint.id,
        "object": "webhook_endpoint",
        "url": endpoint.url,
        "events": list(endpoint.events),
        "created_at": clock.unix(endpoint.created_at),
    }
    if secret is not None:
        payload["secret"] = secret
    return payload
