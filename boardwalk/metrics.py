"""Prometheus metrics: a tiny counter registry shared across processes, and the exposition.

Counters (`counter_inc`) live in the `MetricCounter` table, so every web and worker process
adds to the same number and a restart loses nothing; an increment is one UPDATE (an INSERT
the first time). That is meant for rare events (a lease recovered, a webhook or media fetch
that failed), not for per-item hot paths, which would serialize on the counter row.

Gauges come from collectors: functions an app registers in its AppConfig.ready() that read
current state from the database (queue depth, batches by status, throughput from recent
completions). The core imports no app; apps register here.

Label values must never carry tenant ids or content (docs/API.md "Limits, retention and privacy"):
revision ids, statuses and fixed reason codes only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import F

from boardwalk.models import MetricCounter

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

# Counters every deployment exposes, with their help text, even before the first increment.
COUNTERS: dict[str, str] = {
    "boardwalk_lease_recoveries_total": "Expired leases recovered (outcome: requeued or failed).",
    "boardwalk_webhook_failures_total": "Webhook deliveries that failed (any attempt).",
    "boardwalk_fetch_failures_total": "Media fetches (image URLs) that failed.",
}


@dataclass(frozen=True)
class Sample:
    name: str
    value: float
    labels: str = ""  # labels_text(...)


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # "gauge" or "counter"
    help: str
    samples: tuple[Sample, ...]


Collector = Callable[[], Iterable[Family]]
_collectors: list[Collector] = []


def register_collector(collector: Collector) -> None:
    if collector not in _collectors:
        _collectors.append(collector)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels_text(labels: dict[str, str] | None) -> str:
    """The canonical `k="v",…` text of a label set (sorted, escaped)."""
    pairs = sorted((labels or {}).items())
    for key, _ in pairs:
        if not _LABEL.fullmatch(key):
            raise ValueError(f"invalid label name {key!r}")
    return ",".join(f'{key}="{_escape(str(value))}"' for key, value in pairs)


def counter_inc(name: str, labels: dict[str, str] | None = None, *, by: int = 1) -> None:
    """Add `by` to the counter `name{labels}` for every process (see module doc)."""
    if not _NAME.fullmatch(name) or not name.endswith("_total"):
        raise ValueError(f"counter names end in _total: {name!r}")
    if by <= 0:
        return
    text = labels_text(labels)
    counters = MetricCounter.objects.filter(name=name, labels=text)
    if counters.update(value=F("value") + by):
        return
    try:
        with transaction.atomic():
            MetricCounter.objects.create(name=name, labels=text, value=by)
    except IntegrityError:  # another process created it first
        counters.update(value=F("value") + by)


def _counter_families() -> list[Family]:
    rows: dict[str, list[Sample]] = {name: [] for name in COUNTERS}
    for counter in MetricCounter.objects.order_by("name", "labels"):
        rows.setdefault(counter.name, []).append(
            Sample(counter.name, counter.value, counter.labels)
        )
    return [
        Family(name, "counter", COUNTERS.get(name, name), tuple(samples or [Sample(name, 0)]))
        for name, samples in rows.items()
    ]


def render() -> str:
    """Every family in the Prometheus text exposition format (version 0.0.4)."""
    families = [family for collector in _collectors for family in collector()]
    families += _counter_families()
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape(family.help)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for sample in family.samples:
            value = repr(sample.value) if isinstance(sample.value, float) else str(sample.value)
            labels = f"{{{sample.labels}}}" if sample.labels else ""
            lines.append(f"{sample.name}{labels} {value}")
    return "\n".join(lines) + "\n"
