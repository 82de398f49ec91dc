"""Webhook endpoints (SPEC §10b). The event outbox is webhooks.outbox."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from boardwalk import outbound
from boardwalk.codes import ErrorCode
from boardwalk.errors import InvalidRequest
from boardwalk.ids import new_id
from boardwalk.models import Organization
from files.crypto import Keyring
from webhooks import signing
from webhooks.models import EVENT_TYPES, WebhookEndpoint

logger = logging.getLogger(__name__)

MAX_ENDPOINTS_PER_ORG = 16
MAX_URL_LENGTH = 2048


def _check_url(url: Any) -> str:
    if not isinstance(url, str) or not url or len(url) > MAX_URL_LENGTH:
        raise InvalidRequest(
            f"url must be an https URL of at most {MAX_URL_LENGTH} characters.",
            code=ErrorCode.INVALID_WEBHOOK_URL,
            param="url",
        )
    try:
        scheme, host, port = outbound.parse_target(url)
    except outbound.OutboundRefused as exc:
        raise InvalidRequest(
            f"url is not usable: {exc}.", code=ErrorCode.INVALID_WEBHOOK_URL, param="url"
        ) from exc
    if scheme != "https" and (host, port) not in outbound.allowed_targets():
        raise InvalidRequest("url must use https.", code=ErrorCode.INVALID_WEBHOOK_URL, param="url")
    # The address is checked at each delivery (after DNS), not here: a name can move.
    return url


def _check_events(events: Any) -> list[str]:
    if events is None:
        return list(EVENT_TYPES)
    if (
        not isinstance(events, list)
        or not events
        or not all(isinstance(e, str) and e in EVENT_TYPES for e in events)
    ):
        raise InvalidRequest(
            f"events must be a non-empty list drawn from {', '.join(EVENT_TYPES)}.",
            code=ErrorCode.INVALID_WEBHOOK_EVENTS,
            param="events",
        )
    return sorted(set(events), key=EVENT_TYPES.index)


@transaction.atomic
def webhook_endpoint_create(
    *, org: Organization, url: Any, events: Any = None
) -> tuple[WebhookEndpoint, str]:
    """Register an endpoint; returns it with its signing secret (shown only this once)."""
    checked_url = _check_url(url)
    checked_events = _check_events(events)
    Organization.objects.select_for_update().filter(id=org.id).first()
    if WebhookEndpoint.objects.filter(org=org).count() >= MAX_ENDPOINTS_PER_ORG:
        raise InvalidRequest(
            f"An organization has at most {MAX_ENDPOINTS_PER_ORG} webhook endpoints; delete "
            "one first.",
            code=ErrorCode.TOO_MANY_WEBHOOK_ENDPOINTS,
        )
    key = signing.new_key()
    key_id, wrapped = Keyring.current().wrap(key)
    endpoint = WebhookEndpoint.objects.create(
        id=new_id("we_"),
        org=org,
        url=checked_url,
        events=checked_events,
        secret_key_id=key_id,
        wrapped_secret=wrapped,
    )
    logger.info("webhook endpoint created id=%s org=%s", endpoint.id, org.id)
    return endpoint, signing.secret_text(key)


def webhook_endpoint_delete(*, endpoint: WebhookEndpoint) -> None:
    """Removes the endpoint with its pending deliveries and their history."""
    endpoint.delete()
    logger.info("webhook endpoint deleted id=%s org=%s", endpoint.id, endpoint.org_id)
