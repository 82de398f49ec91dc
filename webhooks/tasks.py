"""Dramatiq actor for webhook deliveries: takes an id, calls the service, safe to run twice."""

from __future__ import annotations

import dramatiq

from webhooks.delivery import delivery_attempt


@dramatiq.actor(queue_name="webhooks", max_retries=0)
def webhook_deliver(delivery_id: int) -> None:
    # No broker retries: a failed attempt schedules the next one in its row, and the sweep
    # re-drives due deliveries (the database, not the broker, holds the schedule).
    delivery_attempt(delivery_id=delivery_id)
