"""One delivery attempt, and the schedule of the next (docs/API.md "Webhooks": at least once, 24
hours).

An attempt first claims its delivery with a compare-and-set that pushes `next_attempt_at`
ahead, so two messages for the same delivery (a re-drive racing the first send) do not
post twice at once; a process killed mid-attempt leaves the claim to lapse and the sweep
re-drives it. Backoff reads `boardwalk.clock`, so tests move time instead of sleeping.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass

import orjson
from django.db.models import F

from boardwalk import clock, outbound
from boardwalk.metrics import counter_inc
from files.crypto import Keyring
from webhooks import signing
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint

logger = logging.getLogger(__name__)

DELIVERY_WINDOW = dt.timedelta(hours=24)
CLAIM = dt.timedelta(seconds=60)  # longer than one attempt can last (outbound timeout)
ATTEMPT_TIMEOUT_SECONDS = 10.0
MAX_ANSWER_BYTES = 64 * 1024
# Seconds to wait after the n-th failed attempt (the last value repeats).
BACKOFF_SECONDS = (5, 30, 120, 600, 1800, 3600, 2 * 3600, 4 * 3600)


def backoff(attempts: int) -> dt.timedelta:
    return dt.timedelta(seconds=BACKOFF_SECONDS[min(attempts, len(BACKOFF_SECONDS)) - 1])


def event_json(*, event_id: str, event_type: str, created_at: dt.datetime, batch_id: str) -> bytes:
    """The event as the SDK's `client.webhooks.unwrap` parses it: ids and a type only, never
    content."""
    return orjson.dumps(
        {
            "id": event_id,
            "object": "event",
            "type": event_type,
            "created_at": clock.unix(created_at),
            "data": {"id": batch_id},
        }
    )


def event_body(delivery: WebhookDelivery) -> bytes:
    """A delivery's event; the same bytes every attempt."""
    event = delivery.event
    return event_json(
        event_id=event.id,
        event_type=event.type,
        created_at=event.created_at,
        batch_id=event.batch_id,
    )


@dataclass(frozen=True)
class PostResult:
    status: int | None  # None: no HTTP answer, `error` says why
    error: str
    latency_ms: int


def signing_keys(endpoint: WebhookEndpoint) -> list[bytes]:
    """The current secret, and the previous one while a rotation keeps it."""
    keyring = Keyring.current()
    keys = [keyring.unwrap(endpoint.secret_key_id, endpoint.wrapped_secret)]
    if endpoint.keeps_previous_secret(clock.now()):
        keys.append(
            keyring.unwrap(endpoint.previous_secret_key_id, endpoint.previous_wrapped_secret)
        )
    return keys


def signed_post(
    endpoint: WebhookEndpoint,
    *,
    msg_id: str,
    body: bytes,
    timeout: float = ATTEMPT_TIMEOUT_SECONDS,
) -> PostResult:
    """POST `body` to the endpoint once, signed, under the outbound rules (no redirects),
    ending within `timeout` seconds."""
    headers = {
        "Content-Type": "application/json",
        **signing.headers(
            signing_keys(endpoint),
            msg_id=msg_id,
            timestamp=int(clock.now().timestamp()),
            body=body,
        ),
    }
    status: int | None = None
    error = ""
    started = time.monotonic()
    try:
        answer = outbound.request(
            "POST",
            endpoint.url,
            body=body,
            headers=headers,
            max_bytes=MAX_ANSWER_BYTES,
            timeout=timeout,
        )
        status = answer.status
    except outbound.OutboundError as exc:
        error = exc.reason
    return PostResult(status, error, int((time.monotonic() - started) * 1000))


def deliveries_due(*, limit: int = 500) -> list[int]:
    """Pending deliveries whose time has come (new, retry due, or a lapsed claim)."""
    return list(
        WebhookDelivery.objects.filter(
            state=WebhookDelivery.State.PENDING, next_attempt_at__lte=clock.now()
        )
        .order_by("next_attempt_at")
        .values_list("id", flat=True)[:limit]
    )


def delivery_attempt(*, delivery_id: int) -> str | None:
    """Post the event once if the delivery is due; returns its state after, None if not due."""
    now = clock.now()
    claimed = WebhookDelivery.objects.filter(
        id=delivery_id, state=WebhookDelivery.State.PENDING, next_attempt_at__lte=now
    ).update(next_attempt_at=now + CLAIM, attempts=F("attempts") + 1)
    if not claimed:
        return None
    delivery = WebhookDelivery.objects.select_related("event", "endpoint").get(id=delivery_id)
    endpoint = delivery.endpoint
    result = signed_post(endpoint, msg_id=delivery.event_id, body=event_body(delivery))
    status, error = result.status, result.error
    WebhookAttempt.objects.create(
        delivery=delivery,
        number=delivery.attempts,
        attempted_at=now,
        status_code=status,
        latency_ms=result.latency_ms,
        error=error,
    )
    ok = status is not None and 200 <= status < 300
    if not ok:  # for /metrics: no endpoint or tenant in the labels
        counter_inc("boardwalk_webhook_failures_total", {"reason": "status" if status else "error"})
    after = clock.now()
    if ok:
        state, next_at = WebhookDelivery.State.DELIVERED, delivery.next_attempt_at
    elif after + backoff(delivery.attempts) > delivery.event.created_at + DELIVERY_WINDOW:
        state, next_at = WebhookDelivery.State.FAILED, delivery.next_attempt_at
    else:
        state, next_at = WebhookDelivery.State.PENDING, after + backoff(delivery.attempts)
    WebhookDelivery.objects.filter(id=delivery.id, state=WebhookDelivery.State.PENDING).update(
        state=state,
        next_attempt_at=next_at,
        last_status=status,
        delivered_at=after if ok else None,
    )
    logger.info(
        "webhook attempt delivery=%s event=%s endpoint=%s n=%s status=%s error=%s -> %s",
        delivery.id,
        delivery.event_id,
        endpoint.id,
        delivery.attempts,
        status,
        error or "-",
        state,
    )
    return str(state)
