"""Reads for the staff console: usage from the hourly rollup, queue health, workers.

Every aggregate is computed by the database (GROUP BY over `billing.UsageRollup`, a few
thousand rows however many events there are); nothing here reads content, and nothing is
scoped to a tenant except by the staff's own choice of organization (drill-down).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db.models import Count, Min, QuerySet, Sum

from batches.models import Batch, BatchItem, WorkerProcess
from billing.metering import ROLLUP_SUMS
from billing.models import UsageRollup
from boardwalk import clock
from boardwalk.codes import ItemCode
from boardwalk.models import Organization
from inference.models import CatalogModel, Deployment, ModelRevision

SUMS = ROLLUP_SUMS
# The rollup's usage classes (billing.metering.UsageClass), as the dashboard names them.
USAGE_CLASSES = (("batch", "Batch"), ("interactive", "Interactive"))
# The codes a stopping batch ends its unrun items with (batches.lifecycle).
STOPPED_CODES = frozenset({ItemCode.BATCH_CANCELLED, ItemCode.BATCH_EXPIRED, ItemCode.BATCH_FAILED})


class Period(StrEnum):
    DAY = "day"
    WEEK = "week"
    MONTH = "month"

    @property
    def span(self) -> dt.timedelta:
        return {"day": dt.timedelta(days=1), "week": dt.timedelta(days=7)}.get(
            self.value, dt.timedelta(days=30)
        )

    @property
    def hourly(self) -> bool:
        return self is Period.DAY


@dataclass
class UsageRow:
    """Sums over the period for one key (an organization, a model, or one point in time)."""

    key: Any
    label: str
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0  # the part of output_tokens that is reasoning
    gpu_microseconds: int = 0
    items_succeeded: int = 0
    items_failed: int = 0  # every failed item, those of stopped batches too (from the items)
    spend_microusd: int = 0
    org_id: str = ""
    # The (revision, deployment) pairs a per-model row adds up (the CSV names them).
    revisions: list[tuple[str, str]] = field(default_factory=list, init=False)

    @property
    def gpu_seconds(self) -> float:
        return self.gpu_microseconds / 1_000_000


@dataclass
class Queue:
    pending_items: int
    running_items: int
    oldest_waiting_since: dt.datetime | None
    by_model: list[tuple[str, int]]  # pending items per model name, most first


@dataclass
class UsageDashboard:
    period: Period
    start: dt.datetime
    end: dt.datetime
    org: Organization | None
    total: UsageRow
    by_org: list[UsageRow]
    by_model: list[UsageRow]
    by_org_model: list[UsageRow]
    by_class: list[UsageRow]  # batch rows, then interactive requests (their items)
    series: list[UsageRow]  # the points with usage, oldest first
    buckets: list[dt.datetime]  # every point of the window, with usage or not
    spend_series_by_org: dict[str, dict[str, int]]
    batches_by_status: dict[str, int]
    expirations: int
    failure_codes: dict[str, int]  # failed items by error code, most first
    items_stopped: int  # failed items that never ran: their batch was cancelled, expired or failed
    queue: Queue
    seconds: float = field(init=False)

    def __post_init__(self) -> None:
        self.seconds = (self.end - self.start).total_seconds()

    @property
    def items_per_second(self) -> float:
        """Items that ran to an outcome; those a stopped batch ended never ran."""
        ran = self.total.items_succeeded + self.total.items_failed - self.items_stopped
        return ran / self.seconds

    @property
    def tokens_per_second(self) -> float:
        return (self.total.input_tokens + self.total.output_tokens) / self.seconds


def _sums() -> dict[str, Sum]:
    return {name: Sum(name) for name in SUMS}


def _row(key: Any, label: str, values: dict[str, Any], org_id: str = "") -> UsageRow:
    return UsageRow(key, label, org_id=org_id, **{n: int(values.get(n) or 0) for n in SUMS})


def _add(into: UsageRow, row: UsageRow) -> None:
    for name in SUMS:
        setattr(into, name, getattr(into, name) + getattr(row, name))


def _catalog_names(revisions: set[str]) -> dict[str, set[str]]:
    """The catalog names of each revision: those serving it now; else, for a revision the
    catalog has since moved on from, those its batches were submitted under (2 queries)."""
    names: dict[str, set[str]] = defaultdict(set)
    for name, revision_id in CatalogModel.objects.filter(revision_id__in=revisions).values_list(
        "name", "revision_id"
    ):
        names[revision_id].add(name)
    if unnamed := revisions - set(names):
        for revision_id, name in (
            Batch.objects.filter(revision_id__in=unnamed, deployment__isnull=True)
            .order_by()
            .values_list("revision_id", "model_name")
            .distinct()
        ):
            names[revision_id].add(name)
    return names


def _revision_labels(revisions: set[str]) -> dict[str, str]:
    return dict(ModelRevision.objects.filter(id__in=revisions).values_list("id", "label"))


def _model_labels(keys: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The model name staff know a (revision, deployment) by, so that batch rows and
    interactive requests of one model add up in one row: the deployment's name, else the
    revision's catalog names (_catalog_names), else, only where nothing names it, the
    revision's label (4 queries at most)."""
    deployments = dict(
        Deployment.objects.filter(id__in={d for _, d in keys if d}).values_list("id", "name")
    )
    names = _catalog_names({r for r, d in keys if not d})
    labels = _revision_labels({r for r, d in keys if not d and r not in names})
    out = {}
    for revision_id, deployment_id in keys:
        if deployment_id:
            name = deployments.get(deployment_id, deployment_id)
            out[(revision_id, deployment_id)] = f"{name} (deployment)"
        else:
            catalog = ", ".join(sorted(names.get(revision_id, ())))
            out[(revision_id, deployment_id)] = catalog or labels.get(revision_id, revision_id)
    return out


def _served_names(revisions: set[str]) -> dict[str, str]:
    """What an engine of each revision serves, by name: its catalog names and the
    deployments on it now, else the revision's label (5 queries at most)."""
    names = _catalog_names(revisions)
    for name, revision_id in Deployment.objects.filter(revision_id__in=revisions).values_list(
        "name", "revision_id"
    ):
        names[revision_id].add(f"{name} (deployment)")
    labels = _revision_labels(revisions - set(names))
    return {r: ", ".join(sorted(names[r])) if r in names else labels.get(r, r) for r in revisions}


def _window(period: Period, org: Organization | None) -> tuple[dt.datetime, dt.datetime, QuerySet]:
    end = clock.now()
    start = end - period.span
    # The rollup's buckets are whole hours: the window starts at the hour holding `start`.
    bucket_start = start.replace(minute=0, second=0, microsecond=0)
    rollup = UsageRollup.objects.filter(bucket__gte=bucket_start)
    if org is not None:
        rollup = rollup.filter(org=org)
    return start, end, rollup


def queue_health(*, org: Organization | None = None) -> Queue:
    items = BatchItem.objects.live()
    if org is not None:
        items = items.filter(org_id_key=org.id)
    counts = dict(items.values("state").annotate(n=Count("id")).values_list("state", "n"))
    pending = items.filter(state=BatchItem.State.PENDING)
    oldest = pending.aggregate(oldest=Min("batch__created_at"))["oldest"]
    by_key = list(
        pending.values("revision_id_key", "deployment_id_key")
        .annotate(n=Count("id"))
        .order_by("-n")
        .values_list("revision_id_key", "deployment_id_key", "n")[:50]
    )
    labels = _model_labels({(r, d) for r, d, _ in by_key})
    by_model: dict[str, int] = defaultdict(int)
    for revision_id, deployment_id, n in by_key:
        by_model[labels[(revision_id, deployment_id)]] += n
    return Queue(
        pending_items=counts.get(BatchItem.State.PENDING, 0),
        running_items=counts.get(BatchItem.State.RUNNING, 0),
        oldest_waiting_since=oldest,
        by_model=sorted(by_model.items(), key=lambda m: (-m[1], m[0]))[:20],
    )


def _buckets(period: Period, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """Every point of the window, oldest first: the hours of a day, the days of a week or a
    month. The charts draw each (zero where nothing ran), so a single busy hour or day reads
    as a bar or a peak in its window, never as a lone dot."""
    step = dt.timedelta(hours=1) if period.hourly else dt.timedelta(days=1)
    t = _point(period, start.replace(minute=0, second=0, microsecond=0))
    out = []
    while t <= end:
        out.append(t)
        t += step
    return out


def _point(period: Period, bucket: dt.datetime) -> dt.datetime:
    """The chart point a rollup hour belongs to: itself (day view) or its day."""
    return bucket if period.hourly else bucket.replace(hour=0)


def usage_dashboard(*, period: Period, org: Organization | None = None) -> UsageDashboard:
    start, end, rollup = _window(period, org)
    # Two GROUP BYs over the rollup, each a few dozen to a few thousand rows back; the
    # coarser views (total, per org, per model) are folded from them here rather than
    # scanned again: on SQLite each scan of a month of rollup rows is the page's main cost.
    # The first groups by class too, for the batch and interactive split.
    sums: dict[tuple[str, str, str], UsageRow] = {}
    classes = {name: UsageRow(name, label) for name, label in USAGE_CLASSES}
    for r in rollup.values("org_id", "revision_id", "deployment_id", "usage_class").annotate(
        **_sums()
    ):
        row = _row(r["usage_class"], "", r)
        if r["usage_class"] == "batch":
            row.items_failed = 0  # counted from the items, below
        where = (r["org_id"], r["revision_id"], r["deployment_id"])
        _add(sums.setdefault(where, UsageRow(where, "")), row)
        _add(classes.setdefault(r["usage_class"], UsageRow(r["usage_class"], "")), row)
    # Failed items are counted from the items, not the rollup: the rollup meters the
    # attempts that ran, while a stopped batch (cancelled, expired, failed) ends its unrun
    # items failed with its code, and an item out of attempts ends without a last attempt.
    failed = BatchItem.objects.filter(state=BatchItem.State.FAILED, completed_at__gte=start)
    if org is not None:
        failed = failed.filter(org_id_key=org.id)
    failed_by_key: dict[tuple[str, str, str], int] = defaultdict(int)
    codes: dict[str, int] = defaultdict(int)
    stopped = 0
    for org_id, revision_id, deployment_id, code, n in (
        failed.values("org_id_key", "revision_id_key", "deployment_id_key", "error_code")
        .annotate(n=Count("id"))
        .order_by()
        .values_list("org_id_key", "revision_id_key", "deployment_id_key", "error_code", "n")
    ):
        failed_by_key[(org_id, revision_id, deployment_id)] += n
        codes[code] += n
        stopped += n if code in STOPPED_CODES else 0
    classes["batch"].items_failed = sum(failed_by_key.values())
    keys = sorted(set(sums) | set(failed_by_key))
    org_names = dict(
        Organization.objects.filter(id__in={k[0] for k in keys}).values_list("id", "name")
    )
    labels = _model_labels({(k[1], k[2]) for k in keys})
    total = UsageRow("total", "Total")
    orgs: dict[str, UsageRow] = {}
    # Rows are per model name, not per revision: a model's batch rows and interactive
    # requests, and its revisions before and after the catalog moved, add up in one row.
    models: dict[str, UsageRow] = {}
    org_models: dict[tuple[str, str], UsageRow] = {}
    for org_id, revision_id, deployment_id in keys:
        model = labels[(revision_id, deployment_id)]
        name = org_names.get(org_id, org_id)
        row = UsageRow((revision_id, deployment_id), "", org_id=org_id)
        metered = sums.get((org_id, revision_id, deployment_id))
        if metered is not None:
            _add(row, metered)  # its items_failed: interactive requests only
        row.items_failed += failed_by_key.get((org_id, revision_id, deployment_id), 0)
        org_model = org_models.setdefault(
            (org_id, model), UsageRow(model, f"{name} · {model}", org_id=org_id)
        )
        _add(org_model, row)
        org_model.revisions.append((revision_id, deployment_id))
        _add(total, row)
        _add(orgs.setdefault(org_id, UsageRow(org_id, name, org_id=org_id)), row)
        _add(models.setdefault(model, UsageRow(model, model)), row)
    by_org_model = sorted(org_models.values(), key=lambda row: row.label)
    by_org = sorted(orgs.values(), key=lambda row: row.label)
    by_model = sorted(models.values(), key=lambda row: row.label)

    # Grouped by the rollup's own hour in SQL, folded into days here: SQLite truncates dates
    # with a Python function per row, which over a month of rollup rows costs more than the
    # rest of the page (docs/PERFORMANCE.md).
    points: dict[dt.datetime, UsageRow] = {}
    for r in rollup.values("bucket").annotate(**_sums()).order_by("bucket"):
        t = _point(period, r["bucket"])
        _add(points.setdefault(t, UsageRow(t, t.isoformat())), _row(t, "", r))
    # Spend lands in the hours batches settled in: few rows, so this scan returns little.
    spend_series: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for bucket, org_id, spend in (
        rollup.filter(spend_microusd__gt=0)
        .values("bucket", "org_id")
        .annotate(spend=Sum("spend_microusd"))
        .order_by("bucket")
        .values_list("bucket", "org_id", "spend")
    ):
        name = org_names.get(org_id, org_id)
        spend_series[name][_point(period, bucket).isoformat()] += int(spend or 0)
    series = list(points.values())

    batches = Batch.objects.filter(created_at__gte=start)
    expired = Batch.objects.filter(status=Batch.Status.EXPIRED, expired_at__gte=start)
    if org is not None:
        batches = batches.filter(org=org)
        expired = expired.filter(org=org)
    by_status = dict(
        batches.values("status").annotate(n=Count("id")).order_by().values_list("status", "n")
    )
    return UsageDashboard(
        period=period,
        start=start,
        end=end,
        org=org,
        total=total,
        by_org=by_org,
        by_model=by_model,
        by_org_model=by_org_model,
        by_class=list(classes.values()),
        series=series,
        buckets=_buckets(period, start, end),
        spend_series_by_org={org: dict(data) for org, data in spend_series.items()},
        batches_by_status=by_status,
        expirations=expired.count(),
        failure_codes=dict(sorted(codes.items(), key=lambda c: (-c[1], c[0]))),
        items_stopped=stopped,
        queue=queue_health(org=org),
    )


@dataclass
class WorkerView:
    id: str
    alive: bool
    started_at: dt.datetime
    seen_at: dt.datetime
    revisions: list[tuple[str, str]]  # (revision id, the model names it serves)
    device: str
    leases: int
    items_recorded: int
    items_per_second: float


def workers_overview() -> list[WorkerView]:
    """Every worker process's liveness row with the leases it holds now and the models its
    engines serve (seven queries at most)."""
    now = clock.now()
    dead_after = dt.timedelta(seconds=settings.WORKER_DEAD_AFTER_SECONDS)
    leases: dict[str, int] = defaultdict(int)
    owners = (
        BatchItem.objects.filter(state=BatchItem.State.RUNNING)
        .values("lease_owner")
        .annotate(n=Count("id"))
        .values_list("lease_owner", "n")
    )
    for owner, n in owners:
        # A lease owner is "<process id>:<thread>" (batches.liveness.worker_id).
        leases[owner.rpartition(":")[0]] += n
    workers = list(WorkerProcess.objects.order_by("id"))
    names = _served_names({r for w in workers for r in w.revisions or []})
    return [
        WorkerView(
            id=w.id,
            alive=now - w.seen_at <= dead_after,
            started_at=w.started_at,
            seen_at=w.seen_at,
            revisions=[(r, names[r]) for r in w.revisions or []],
            device=w.device,
            leases=leases.get(w.id, 0),
            items_recorded=w.items_recorded,
            items_per_second=w.items_per_second,
        )
        for w in workers
    ]


def organization_for_staff(*, org_id: str) -> Organization | None:
    """The organization a staff member drills down to (staff see every tenant)."""
    return Organization.objects.filter(id=org_id).first()
