from __future__ import annotations

from boardwalk.codes import ErrorCode
from boardwalk.errors import InvalidRequest, NotFound
from boardwalk.models import Organization
from webhooks.models import WebhookEndpoint


def webhook_endpoint_get_for_org(*, org: Organization, endpoint_id: str) -> WebhookEndpoint:
    endpoint = WebhookEndpoint.objects.filter(org=org, id=endpoint_id).first()
    if endpoint is None:
        raise NotFound(f"No webhook endpoint with id {endpoint_id!r}.", param="endpoint_id")
    return endpoint


def webhook_endpoints_page(
    *, org: Organization, limit: int, after: str | None
) -> tuple[list[WebhookEndpoint], bool]:
    """Newest first, `limit` per page after the endpoint `after` (the SDK's cursor).

    An organization has at most 16 endpoints, so the page is cut from the whole list.
    """
    endpoints = list(WebhookEndpoint.objects.filter(org=org).order_by("-created_at", "-id"))
    if after:
        ids = [e.id for e in endpoints]
        if after not in ids:
            raise InvalidRequest(
                f"Unknown cursor {after!r} for 'after'.",
                code=ErrorCode.INVALID_CURSOR,
                param="after",
            )
        endpoints = endpoints[ids.index(after) + 1 :]
    return endpoints[:limit], len(endpoints) > limit
