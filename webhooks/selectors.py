from __future__ import annotations

from boardwalk.errors import NotFound
from boardwalk.models import Organization
from webhooks.models import WebhookEndpoint


def webhook_endpoint_get_for_org(*, org: Organization, endpoint_id: str) -> WebhookEndpoint:
    endpoint = WebhookEndpoint.objects.filter(org=org, id=endpoint_id).first()
    if endpoint is None:
        raise NotFound(f"No webhook endpoint with id {endpoint_id!r}.", param="endpoint_id")
    return endpoint


def webhook_endpoints_for_org(*, org: Organization) -> list[WebhookEndpoint]:
    return list(WebhookEndpoint.objects.filter(org=org).order_by("-created_at", "-id"))
