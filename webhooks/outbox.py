"""The event outbox (docs/API.md "Webhooks"): a terminal batch writes its event and deliveries in
the same transaction, and they are sent after commit.

Kept apart from webhooks.services because it imports the actor module, which must load only
after the broker exists (the admin imports webhooks.services early, at autodiscovery).
"""

from __future__ import annotations

from boardwalk import clock
from boardwalk.broker import send_after_commit
from boardwalk.ids import derived_id
from webhooks.models import EVENT_TYPES, WebhookDelivery, WebhookEndpoint, WebhookEvent
from webhooks.tasks import webhook_deliver


def batch_event_record(*, org_id: str, batch_id: str, status: str) -> WebhookEvent | None:
    """Write the terminal event of a batch and its deliveries: the outbox.

    Caller is inside the transaction that makes the batch terminal, so the event exists
    exactly when the terminal state does; deliveries are sent after commit, and the sweep
    re-drives any whose message was lost. Safe to call twice (the event id is derived from
    the batch).
    """
    event_type = f"batch.{status}"
    if event_type not in EVENT_TYPES:
        return None
    event_id = derived_id("evt_", batch_id, "terminal")
    if WebhookEvent.objects.filter(id=event_id).exists():
        return None
    event = WebhookEvent.objects.create(
        id=event_id, org_id=org_id, type=event_type, batch_id=batch_id, created_at=clock.now()
    )
    endpoints = [
        e for e in WebhookEndpoint.objects.filter(org_id=org_id) if event_type in e.event_types
    ]
    deliveries = WebhookDelivery.objects.bulk_create(
        [WebhookDelivery(event=event, endpoint=e, next_attempt_at=clock.now()) for e in endpoints]
    )
    ids = [d.id for d in deliveries]
    if ids:
        webhook_deliveries_send_after_commit(ids)
    return event


def webhook_deliveries_send_after_commit(delivery_ids: list[int]) -> None:
    """The one place deliveries are enqueued (after commit: the worker must find the rows).

    A broker that cannot be reached costs latency only: the sweeper re-sends due deliveries.
    """
    for delivery_id in delivery_ids:
        send_after_commit(webhook_deliver, delivery_id)
