"""Webhook endpoints (docs/API.md "Webhooks"), in the shape of the `openai` SDK's `client.webhooks`.

The event outbox is webhooks.outbox; one delivery attempt is webhooks.delivery.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
import unicodedata
from collections.abc import Mapping
from typing import Any

from django.db import transaction

from boardwalk import clock, outbound
from boardwalk.channels import channels
from boardwalk.codes import ErrorCode
from boardwalk.errors import CapacityExceeded, Conflict, InvalidRequest
from boardwalk.ids import new_id
from boardwalk.models import Organization
from files.crypto import Keyring
from webhooks import signing
from webhooks.delivery import event_json, signed_post
from webhooks.models import EVENT_TYPES, WebhookEndpoint

logger = logging.getLogger(__name__)

MAX_ENDPOINTS_PER_ORG = 16
MAX_URL_LENGTH = 2048
MAX_NAME_LENGTH = 128
KEEP_OLD_SECRET = dt.timedelta(hours=24)
UPDATABLE_FIELDS = ("name", "url", "event_types")
# What a test delivery's `data.id` holds: a sample that names no batch.
TEST_BATCH_ID = "batch_test"
# A test delivery holds a web thread while it waits for the receiver: it ends within this
# many seconds (connect, send and answer), and an organization runs this many at once.
TEST_TIMEOUT_SECONDS = 5.0
MAX_CONCURRENT_TESTS_PER_ORG = 2
# Test slots are counted per epoch of this many seconds (longer than a test lasts): one
# that a dying process never gave back stops counting two epochs later, however busy the org.
_TEST_SLOT_EPOCH_SECONDS = 60
# WHATWG's forbidden host code points (besides whitespace and controls, refused everywhere):
# a host holding one is not the host a client would connect to.
_FORBIDDEN_IN_HOST = frozenset("#%/:<>?@[\\]^|")


def _has_control_or_space(text: str) -> bool:
    return any(ch.isspace() or unicodedata.category(ch).startswith("C") for ch in text)


def _required(value: Any, param: str) -> Any:
    if value is None:
        raise InvalidRequest(
            f"Missing required parameter {param!r}.",
            code=ErrorCode.MISSING_REQUIRED_PARAMETER,
            param=param,
        )
    return value


def _check_name(name: Any) -> str:
    if (
        not isinstance(name, str)
        or not name.strip()
        or len(name) > MAX_NAME_LENGTH
        or any(unicodedata.category(ch) == "Cc" for ch in name)
    ):
        raise InvalidRequest(
            f"name must be a non-blank string of at most {MAX_NAME_LENGTH} characters, "
            "without control characters.",
            code=ErrorCode.INVALID_NAME,
            param="name",
        )
    return name


def _bad_url(reason: str) -> InvalidRequest:
    return InvalidRequest(
        f"url is not usable: {reason}.", code=ErrorCode.INVALID_WEBHOOK_URL, param="url"
    )


def _check_url(url: Any) -> str:
    if not isinstance(url, str) or not url or len(url) > MAX_URL_LENGTH:
        raise _bad_url(f"it must be an https URL of at most {MAX_URL_LENGTH} characters")
    # urlsplit drops tabs and newlines and keeps spaces, so "https://exam\nple.com/" would be
    # checked as one host and stored as another: refuse such URLs before parsing them.
    if _has_control_or_space(url):
        raise _bad_url("it holds whitespace or control characters (percent-encode them)")
    try:
        scheme, host, port = outbound.parse_target(url)
    except outbound.OutboundRefused as exc:
        raise _bad_url(str(exc)) from exc
    # (An IPv6 literal is the one host with colons; parse_target took off its brackets.)
    if ":" not in host and _FORBIDDEN_IN_HOST.intersection(host):
        raise _bad_url(f"the host {host!r} holds characters a host cannot hold")
    if scheme != "https" and (host, port) not in outbound.allowed_targets():
        raise _bad_url("it must use https")
    # The address is checked at each delivery (after DNS), not here: a name can move.
    return url


def _check_event_type(event_type: Any, *, param: str) -> str:
    if not isinstance(event_type, str) or event_type not in EVENT_TYPES:
        raise InvalidRequest(
            f"Unknown event type {event_type!r} in {param}; Boardwalk emits "
            f"{', '.join(EVENT_TYPES)}.",
            code=ErrorCode.INVALID_WEBHOOK_EVENTS,
            param=param,
        )
    return event_type


def _check_event_types(event_types: Any) -> list[str]:
    if not isinstance(event_types, list) or not event_types:
        raise InvalidRequest(
            f"event_types must be a non-empty list drawn from {', '.join(EVENT_TYPES)}.",
            code=ErrorCode.INVALID_WEBHOOK_EVENTS,
            param="event_types",
        )
    checked = {_check_event_type(e, param="event_types") for e in event_types}
    return sorted(checked, key=EVENT_TYPES.index)


def webhook_endpoint_fields_check(changes: Mapping[str, Any]) -> dict[str, Any]:
    """The given fields of UPDATABLE_FIELDS, checked (InvalidRequest names the first bad one)."""
    checks = {"name": _check_name, "url": _check_url, "event_types": _check_event_types}
    return {field: checks[field](changes[field]) for field in UPDATABLE_FIELDS if field in changes}


def _new_secret() -> tuple[str, bytes, str, str]:
    """(key id, wrapped key, hint, the secret's text): the text goes to the caller only."""
    key = signing.new_key()
    key_id, wrapped = Keyring.current().wrap(key)
    return key_id, wrapped, signing.secret_hint(key), signing.secret_text(key)


@transaction.atomic
def webhook_endpoint_create(
    *, org: Organization, name: Any, url: Any, event_types: Any
) -> tuple[WebhookEndpoint, str]:
    """Register an endpoint; returns it with its signing secret (shown only this once)."""
    given = {"name": name, "url": url, "event_types": event_types}
    checked = webhook_endpoint_fields_check(
        {field: _required(value, field) for field, value in given.items()}
    )
    Organization.objects.select_for_update().filter(id=org.id).first()
    if WebhookEndpoint.objects.filter(org=org).count() >= MAX_ENDPOINTS_PER_ORG:
        # A conflict with the organization's state (409, not retried): it succeeds once an
        # endpoint is deleted, never by sending the same request again.
        raise Conflict(
            f"An organization has at most {MAX_ENDPOINTS_PER_ORG} webhook endpoints; delete "
            "one first.",
            code=ErrorCode.TOO_MANY_WEBHOOK_ENDPOINTS,
        )
    key_id, wrapped, hint, secret = _new_secret()
    now = clock.now()
    endpoint = WebhookEndpoint.objects.create(
        id=new_id("we_"),
        org=org,
        **checked,
        secret_key_id=key_id,
        wrapped_secret=wrapped,
        secret_hint=hint,
        created_at=now,
        updated_at=now,
    )
    logger.info("webhook endpoint created id=%s org=%s", endpoint.id, org.id)
    return endpoint, secret


@transaction.atomic
def webhook_endpoint_update(
    *, endpoint: WebhookEndpoint, changes: Mapping[str, Any]
) -> WebhookEndpoint:
    """Set any of name, url and event_types (all checked before anything is written).

    Pending deliveries go to the new url; `updated_at` moves only if something changed.
    """
    checked = webhook_endpoint_fields_check(changes)
    locked = WebhookEndpoint.objects.select_for_update().get(id=endpoint.id)
    changed = [field for field, value in checked.items() if getattr(locked, field) != value]
    if changed:
        for field in changed:
            setattr(locked, field, checked[field])
        locked.updated_at = clock.now()
        locked.save(update_fields=[*changed, "updated_at"])
        logger.info("webhook endpoint updated id=%s fields=%s", locked.id, ",".join(changed))
    return locked


@transaction.atomic
def webhook_endpoint_rotate_secret(
    *, endpoint: WebhookEndpoint, keep_old_secret_active_for_24_hours: Any = False
) -> tuple[WebhookEndpoint, str]:
    """A new signing secret, returned only here. Kept, the old one also signs for 24 hours."""
    if not isinstance(keep_old_secret_active_for_24_hours, bool):
        raise InvalidRequest(
            "keep_old_secret_active_for_24_hours must be a boolean.",
            code=ErrorCode.INVALID_REQUEST,
            param="keep_old_secret_active_for_24_hours",
        )
    locked = WebhookEndpoint.objects.select_for_update().get(id=endpoint.id)
    now = clock.now()
    if keep_old_secret_active_for_24_hours:
        locked.previous_secret_key_id = locked.secret_key_id
        locked.previous_wrapped_secret = locked.wrapped_secret
        locked.previous_secret_expires_at = now + KEEP_OLD_SECRET
    else:
        locked.previous_secret_key_id = ""
        locked.previous_wrapped_secret = None
        locked.previous_secret_expires_at = None
    key_id, wrapped, hint, secret = _new_secret()
    locked.secret_key_id, locked.wrapped_secret, locked.secret_hint = key_id, wrapped, hint
    locked.updated_at = now
    locked.save()
    logger.info(
        "webhook secret rotated id=%s keep_old=%s", locked.id, keep_old_secret_active_for_24_hours
    )
    return locked, secret


def webhook_endpoint_test(*, endpoint: WebhookEndpoint, event_type: Any) -> tuple[str, int]:
    """Send one signed sample event now; returns its event type and the endpoint's HTTP status.

    The sample has a fresh event id and `data.id` "batch_test"; it is not recorded as a
    delivery and never retried. No HTTP answer at all is a 400 naming the reason.
    """
    checked = _check_event_type(_required(event_type, "event_type"), param="event_type")
    event_id = new_id("evt_")
    body = event_json(
        event_id=event_id, event_type=checked, created_at=clock.now(), batch_id=TEST_BATCH_ID
    )
    epoch = _test_slot_take(endpoint.org_id)
    try:
        result = signed_post(endpoint, msg_id=event_id, body=body, timeout=TEST_TIMEOUT_SECONDS)
    finally:
        _test_slots_add(endpoint.org_id, epoch, -1)
    logger.info(
        "webhook test endpoint=%s event=%s status=%s error=%s",
        endpoint.id,
        event_id,
        result.status,
        result.error or "-",
    )
    if result.status is None:
        raise InvalidRequest(
            f"The test delivery got no HTTP answer ({result.error}).",
            code=ErrorCode.WEBHOOK_ENDPOINT_UNREACHABLE,
        )
    return checked, result.status


def _test_slots_add(org_id: str, epoch: int, delta: int) -> int:
    """Add `delta` to the epoch's test slots; the tests in flight, this epoch's and the last's
    (boardwalk.channels: Redis in production, so every web process counts against one limit)."""
    ch = channels()
    ttl = 2 * _TEST_SLOT_EPOCH_SECONDS
    taken = ch.add(f"webhooks:tests:{org_id}:{epoch}", delta, ttl=ttl)
    return taken + ch.add(f"webhooks:tests:{org_id}:{epoch - 1}", 0, ttl=ttl)


def _test_slot_take(org_id: str) -> int:
    """Take one of the organization's test slots (its epoch, to give it back), or raise 429:
    one organization's tests against a silent receiver cannot occupy the web threads."""
    epoch = int(time.time() // _TEST_SLOT_EPOCH_SECONDS)
    if _test_slots_add(org_id, epoch, 1) > MAX_CONCURRENT_TESTS_PER_ORG:
        _test_slots_add(org_id, epoch, -1)
        raise CapacityExceeded(
            f"Too many webhook tests in flight: your organization may run "
            f"{MAX_CONCURRENT_TESTS_PER_ORG} at once. Retry when one has finished.",
            code=ErrorCode.RATE_LIMIT_EXCEEDED,
            retry_after=math.ceil(TEST_TIMEOUT_SECONDS),
        )
    return epoch


def webhook_endpoint_delete(*, endpoint: WebhookEndpoint) -> None:
    """Removes the endpoint with its pending deliveries and their history."""
    endpoint_id = endpoint.id  # delete() clears the instance's pk
    endpoint.delete()
    logger.info("webhook endpoint deleted id=%s org=%s", endpoint_id, endpoint.org_id)
