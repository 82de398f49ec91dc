"""Gauges of the batch queue for /metrics (registered in BatchesConfig.ready()), and the
interactive tier's beside them (batches.interactive.gauges).

Read from the database on each scrape, so every web process answers the same numbers.
Labels are revision ids and statuses only: never an organization, a batch or content.
"""

from __future__ import annotations

import datetime as dt

from django.db.models import Count, Min, Sum

from batches.interactive.gauges import interactive_families
from batches.models import Batch, BatchItem
from boardwalk import clock
from boardwalk.metrics import Family, Sample, labels_text

# Throughput is measured over the completions of this recent window.
THROUGHPUT_WINDOW = dt.timedelta(seconds=60)


def collect() -> list[Family]:
    now = clock.now()
    per_state = (
        BatchItem.objects.live()
        .values("revision_id_key", "state")
        .annotate(count=Count("id"))
        .order_by("revision_id_key", "state")
    )
    waiting: list[Sample] = []
    running: list[Sample] = []
    for row in per_state:
        pending = row["state"] == BatchItem.State.PENDING
        sample = Sample(
            "boardwalk_queue_depth" if pending else "boardwalk_items_running",
            row["count"],
            labels_text({"revision": row["revision_id_key"]}),
        )
        (waiting if pending else running).append(sample)

    oldest = (
        BatchItem.objects.live()
        .filter(state=BatchItem.State.PENDING)
        .aggregate(since=Min("batch__created_at"))["since"]
    )
    age = max(0.0, (now - oldest).total_seconds()) if oldest else 0.0

    seconds = THROUGHPUT_WINDOW.total_seconds()
    items: list[Sample] = []
    tokens: list[Sample] = []
    recent = (
        BatchItem.objects.filter(completed_at__gte=now - THROUGHPUT_WINDOW)
        .values("revision_id_key")
        .annotate(
            count=Count("id"),
            prompt=Sum("usage_prompt_tokens"),
            completion=Sum("usage_completion_tokens"),
        )
        .order_by("revision_id_key")
    )
    for row in recent:
        revision = row["revision_id_key"]
        items.append(
            Sample(
                "boardwalk_items_per_second",
                row["count"] / seconds,
                labels_text({"revision": revision}),
            )
        )
        for kind in ("prompt", "completion"):
            tokens.append(
                Sample(
                    "boardwalk_tokens_per_second",
                    (row[kind] or 0) / seconds,
                    labels_text({"revision": revision, "kind": kind}),
                )
            )

    by_status = dict(
        Batch.objects.values_list("status").annotate(count=Count("id")).order_by("status")
    )
    batches = [
        Sample("boardwalk_batches", by_status.get(status, 0), labels_text({"status": status}))
        for status in Batch.Status.values
    ]
    return [
        Family("boardwalk_queue_depth", "gauge", "Items waiting to be claimed.", tuple(waiting)),
        Family("boardwalk_items_running", "gauge", "Items claimed by a worker.", tuple(running)),
        Family(
            "boardwalk_oldest_waiting_item_age_seconds",
            "gauge",
            "Age of the oldest waiting item's batch, in seconds (0 when none waits).",
            (Sample("boardwalk_oldest_waiting_item_age_seconds", age),),
        ),
        Family(
            "boardwalk_items_per_second",
            "gauge",
            "Items finished per second over the last minute, by revision.",
            tuple(items),
        ),
        Family(
            "boardwalk_tokens_per_second",
            "gauge",
            "Prompt and completion tokens per second over the last minute, by revision.",
            tuple(tokens),
        ),
        Family("boardwalk_batches", "gauge", "Batches by status.", tuple(batches)),
        *interactive_families(),
    ]
