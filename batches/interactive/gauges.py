"""Gauges of the interactive tier for /metrics (batches.metrics adds them to the batch ones).

Read from the channels on each scrape (Redis: every web process answers the same numbers),
for each engine key that can take interactive requests (the catalog's revisions and the
deployments), summed per revision: labels are revision ids only, never an organization or a
deployment. Without Redis at hand the families are left out rather than the scrape failing.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from batches.interactive.messages import headroom_gauge, in_flight_gauge, request_channel
from batches.queue import EngineKey
from boardwalk.broker import BROKER_UNREACHABLE
from boardwalk.channels import channels
from boardwalk.logs import exception_trace
from boardwalk.metrics import Family, Sample, labels_text
from inference.models import CatalogModel, Deployment

logger = logging.getLogger(__name__)

FAMILIES = (
    ("boardwalk_interactive_queued", "Interactive requests waiting for a worker to take them."),
    ("boardwalk_interactive_in_flight", "Interactive requests the workers' engines are running."),
    ("boardwalk_interactive_free_rows", "Engine rows free for interactive requests (flex)."),
)


def _keys() -> set[EngineKey]:
    catalog = CatalogModel.objects.values_list("revision_id", flat=True)
    deployments = Deployment.objects.values_list("revision_id", "id")
    return {EngineKey(r, "") for r in catalog} | {EngineKey(r, d) for r, d in deployments}


def interactive_families() -> list[Family]:
    ch = channels()
    values: dict[str, dict[str, int]] = {name: defaultdict(int) for name, _ in FAMILIES}
    try:
        for key in _keys():
            revision = key.revision_id
            values["boardwalk_interactive_queued"][revision] += ch.length(request_channel(key))
            in_flight = ch.gauge_sum(in_flight_gauge(key))
            values["boardwalk_interactive_in_flight"][revision] += in_flight
            values["boardwalk_interactive_free_rows"][revision] += ch.gauge_sum(headroom_gauge(key))
    except BROKER_UNREACHABLE as exc:
        logger.warning("interactive gauges left out: %s", exception_trace(exc))
        return []
    return [
        Family(
            name,
            "gauge",
            help_text,
            tuple(
                Sample(name, n, labels_text({"revision": revision}))
                for revision, n in sorted(values[name].items())
            ),
        )
        for name, help_text in FAMILIES
    ]
