"""Reads of batches and receipts, always scoped to the organization."""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet

from batches.models import Batch, BatchItem
from boardwalk.codes import ErrorCode
from boardwalk.errors import InvalidRequest, NotFound
from boardwalk.models import Organization


def batch_get_for_org(*, org: Organization, batch_id: str) -> Batch:
    batch = Batch.objects.filter(org=org, id=batch_id).select_related("revision").first()
    if batch is None:
        raise NotFound(f"No batch with id {batch_id!r}.", param="batch_id")
    return batch


def _after(
    queryset: QuerySet, *, after: str | None, row: object | None, fields: tuple[str, str]
) -> QuerySet:
    if not after:
        return queryset
    if row is None:
        raise InvalidRequest(
            f"Unknown cursor {after!r} for 'after'.", code=ErrorCode.INVALID_CURSOR, param="after"
        )
    first, second = fields
    value = getattr(row, first)
    return queryset.filter(
        Q(**{f"{first}__lt": value}) | Q(**{first: value, f"{second}__lt": getattr(row, second)})
    )


def batches_page(*, org: Organization, limit: int, after: str | None) -> tuple[list[Batch], bool]:
    """Newest first; `after` is the id of the last batch of the previous page."""
    queryset = (
        Batch.objects.filter(org=org).select_related("revision").order_by("-created_at", "-id")
    )
    cursor = Batch.objects.filter(org=org, id=after).first() if after else None
    rows = list(_after(queryset, after=after, row=cursor, fields=("created_at", "id"))[: limit + 1])
    return rows[:limit], len(rows) > limit


def _receipted(org: Organization) -> QuerySet[BatchItem]:
    """The rows with a receipt: every published row and every other row that was charged
    (a deployment pays the GPU time of stopped work), so a batch's receipts add up to its
    charge."""
    return BatchItem.objects.filter(Q(published=True) | Q(charge_microusd__gt=0), org_id_key=org.id)


def receipt_get_for_org(*, org: Organization, request_id: str) -> BatchItem:
    item = _receipted(org).filter(request_id=request_id).select_related("batch").first()
    if item is None:
        raise NotFound(f"No request with id {request_id!r}.", param="request_id")
    return item


def receipts_page(
    *, org: Organization, batch_id: str | None, limit: int, after: str | None
) -> tuple[list[BatchItem], bool]:
    queryset = _receipted(org).select_related("batch")
    if batch_id:
        queryset = queryset.filter(batch_id=batch_id)
    queryset = queryset.order_by("-completed_at", "-id")
    cursor = _receipted(org).filter(request_id=after).first() if after else None
    rows = list(
        _after(queryset, after=after, row=cursor, fields=("completed_at", "id"))[: limit + 1]
    )
    return rows[:limit], len(rows) > limit


def batch_request_counts(*, batch_id: str) -> tuple[int, int]:
    """(completed, failed) items of a batch still in progress, from the item states."""
    counts = BatchItem.objects.filter(batch_id=batch_id).aggregate(
        completed=Count("id", filter=Q(state=BatchItem.State.SUCCEEDED)),
        failed=Count("id", filter=Q(state=BatchItem.State.FAILED)),
    )
    return counts["completed"], counts["failed"]
