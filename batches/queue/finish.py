"""Finishing work: results written under their fencing token, leases handed back, stopped
batches' open items ended, charges set, and the one place per-item usage is metered.

A result is written only while the worker's lease on its row is current and unexpired: the
compare-and-set on (state, owner, token) fences off a worker whose item was re-claimed or
whose batch stopped; the expiry check fences off one that paused past its lease although
nobody has re-claimed the item yet. The batch row is never touched per item.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import F

from batches.models import BatchItem
from billing.metering import UsageFacts, seconds_to_microseconds, usage_record
from boardwalk import clock
from boardwalk.faultpoints import fault_point


@dataclass
class ItemOutcome:
    """A finished item as the record stage writes it (no content beyond the sealed row)."""

    item: BatchItem
    succeeded: bool
    result: bytes | None = None
    error_code: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    gpu_seconds: float = 0.0
    reasoning_tokens: int = 0  # the part of completion_tokens that is reasoning


def items_meter(outcomes: Iterable[ItemOutcome], *, released: bool = False) -> None:
    """THE place for per-item metering, called inside the transaction that wrote the rows
    under their fence (a recorded result, or `released`: a lease handed back with the GPU
    time spent on it). The events and the rollup (billing.metering) commit or roll back with
    the rows themselves, so usage is recorded exactly once per attempt. Tokens count only
    for a succeeded row; GPU time for every outcome, aborted work included (docs/API.md "Billing").
    """
    usage_record(
        facts=[
            UsageFacts(
                org_id=o.item.org_id_key,
                batch_id=o.item.batch_id,
                item_id=o.item.pk,
                revision_id=o.item.revision_id_key,
                deployment_id=o.item.deployment_id_key,
                prompt_tokens=o.prompt_tokens,
                cached_tokens=o.cached_tokens if o.succeeded else 0,
                completion_tokens=o.completion_tokens if o.succeeded else 0,
                reasoning_tokens=o.reasoning_tokens if o.succeeded else 0,
                attempt=o.item.lease_token,
                outcome="released" if released else "succeeded" if o.succeeded else "failed",
                gpu_microseconds=seconds_to_microseconds(o.gpu_seconds),
            )
            for o in outcomes
        ]
    )


def items_record(
    *,
    outcomes: list[ItemOutcome],
    worker_id: str,
    in_transaction: Callable[[list[ItemOutcome]], None] | None = None,
) -> list[bool]:
    """Write a group of results in ONE transaction, each row under its own fencing token.

    Returns, per outcome, whether it was written (False: the lease was lost). The batch row
    is not touched: request counts are derived from item states until finalization fixes
    them, so no row is locked by every item write. `in_transaction` runs inside the same
    transaction with the outcomes that were written: the record stage passes `items_meter`.
    On PostgreSQL the group is one statement (`_fenced_group_sql`), elsewhere one per row.
    """
    now = clock.now()
    at = connection.ops.adapt_datetimefield_value(now)
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql" and outcomes:
            cursor.execute(
                _fenced_group_sql(),
                [
                    at,  # SET completed_at; then the arrays, then the fence's own values
                    [o.item.id for o in outcomes],
                    [str(_state_of(o)) for o in outcomes],
                    [o.result for o in outcomes],
                    [o.error_code for o in outcomes],
                    [o.prompt_tokens for o in outcomes],
                    [o.cached_tokens if o.succeeded else 0 for o in outcomes],
                    [o.completion_tokens if o.succeeded else 0 for o in outcomes],
                    [o.reasoning_tokens if o.succeeded else 0 for o in outcomes],
                    [o.item.lease_token for o in outcomes],
                    str(BatchItem.State.RUNNING),
                    worker_id,
                    at,
                ],
            )
            done = {pk for (pk,) in cursor.fetchall()}
            written = [o.item.id in done for o in outcomes]
        else:
            written = [_record_one(cursor, o, worker_id, at) for o in outcomes]
        fault_point("item_finish.in_transaction")  # test only: holding the written rows' locks
        if in_transaction is not None:
            in_transaction([o for o, ok in zip(outcomes, written, strict=True) if ok])
    return written


def item_finish(
    *,
    item: BatchItem,
    worker_id: str,
    succeeded: bool,
    result: bytes | None,
    error_code: str = "",
    prompt_tokens: int = 0,
    cached_tokens: int = 0,
    completion_tokens: int = 0,
    gpu_seconds: float = 0.0,
) -> bool:
    """Record one item's result; False if the lease was lost (see `items_record`)."""
    outcome = ItemOutcome(
        item,
        succeeded,
        result,
        error_code,
        prompt_tokens,
        cached_tokens,
        completion_tokens,
        gpu_seconds,
    )
    return items_record(outcomes=[outcome], worker_id=worker_id)[0]


def item_release(*, item: BatchItem, worker_id: str, gpu_seconds: float = 0.0) -> bool:
    """Give an unfinished item back (aborted or worker stopping); its GPU time still counts.

    The GPU time is metered in the transaction that hands the lease back, under the same fence:
    deployments pay for aborted work (docs/API.md "Billing"), and only once. False if the lease was
    lost already (nothing is handed back, nothing metered).
    """
    with transaction.atomic():
        released = (
            BatchItem.objects.running()
            .filter(id=item.id, lease_owner=worker_id, lease_token=item.lease_token)
            .update(state=BatchItem.State.PENDING, lease_owner="", lease_expires_at=None)
        )
        if released:
            items_meter([ItemOutcome(item, False, gpu_seconds=gpu_seconds)], released=True)
    return bool(released)


def batch_end_open_items(*, batch_id: str, code: str) -> int:
    """End every item of a stopping batch that will never run: `failed` with `code`.

    Called in the transaction that makes the batch terminal, so the queue never holds work
    of a batch that ended (cancelled and expired batches left it `pending` for good). The
    lease token moves on too: a result still on its way is refused by the fence.
    """
    return (
        BatchItem.objects.open()
        .filter(batch_id=batch_id)
        .update(
            state=BatchItem.State.FAILED,
            error_code=code,
            lease_owner="",
            lease_expires_at=None,
            lease_token=F("lease_token") + 1,
            completed_at=clock.now(),
        )
    )


def items_set_charges(charges: dict[int, int]) -> None:
    """Each published item's charge (finalization): on PostgreSQL one statement over two
    arrays, elsewhere one statement run per row. The ORM's `bulk_update` built a CASE over
    every row, costly in Python for a large batch; executemany on PostgreSQL stalls now and
    then (see `batches.queue.enqueue.items_insert`)."""
    if not charges:
        return
    quote = connection.ops.quote_name
    table, charge, pk = quote(BatchItem._meta.db_table), quote("charge_microusd"), quote("id")
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"UPDATE {table} SET {charge} = c.amount "  # noqa: S608
                "FROM unnest(%s::bigint[], %s::bigint[]) AS c(id, amount) "
                f"WHERE {table}.{pk} = c.id",
                [list(charges), list(charges.values())],
            )
            return
        sql = f"UPDATE {table} SET {charge} = %s WHERE {pk} = %s"  # noqa: S608
        cursor.executemany(sql, [(amount, item_id) for item_id, amount in charges.items()])


# -- the fenced writes' SQL --------------------------------------------------------------------

# The columns a fenced write sets, in the order `_record_one` passes their values.
_FENCED_WRITE = (
    "state",
    "result",
    "error_code",
    "usage_prompt_tokens",
    "usage_cached_tokens",
    "usage_completion_tokens",
    "usage_reasoning_tokens",
    "lease_owner",
    "lease_expires_at",
    "completed_at",
)
_fenced_sql: dict[str, str] = {}


def _column(name: str) -> str:
    return connection.ops.quote_name(BatchItem._meta.get_field(name).column)  # type: ignore[union-attr,arg-type]


def _fenced_write_sql() -> str:
    """The fenced write of one finished row, as SQL built once per database vendor.

    Plain SQL because the same ORM update, compiled per row, cost more Python than the
    statement itself took (under the GIL the engine thread needs).
    """
    vendor = connection.vendor
    if vendor not in _fenced_sql:
        assignments = ", ".join(f"{_column(name)} = %s" for name in _FENCED_WRITE)
        fence = " AND ".join(
            f"{_column(n)} = %s" for n in ("id", "state", "lease_owner", "lease_token")
        )
        table = connection.ops.quote_name(BatchItem._meta.db_table)
        # Only the model's own quoted table and column names are formatted in; every value
        # is a parameter.
        _fenced_sql[vendor] = (
            f"UPDATE {table} SET {assignments} "  # noqa: S608
            f"WHERE {fence} AND {_column('lease_expires_at')} > %s"
        )
    return _fenced_sql[vendor]


def _fenced_group_sql() -> str:
    """The fenced write of a whole group on PostgreSQL: one statement over arrays (one per
    column), under the same fence per row as `_fenced_write_sql`, RETURNING the ids written.
    One statement per row cost the record thread and the database's core a round trip each."""
    if "group" not in _fenced_sql:
        table = connection.ops.quote_name(BatchItem._meta.db_table)
        per_row = (
            ("id", "bigint"),
            ("state", "text"),
            ("result", "bytea"),
            ("error_code", "text"),
            ("usage_prompt_tokens", "integer"),
            ("usage_cached_tokens", "integer"),
            ("usage_completion_tokens", "integer"),
            ("usage_reasoning_tokens", "integer"),
            ("lease_token", "bigint"),
        )
        arrays = ", ".join(f"%s::{kind}[]" for _, kind in per_row)
        names = ", ".join(f"v_{name}" for name, _ in per_row)
        assignments = ", ".join(
            # Every column but the id and the lease token (the fence's own)
            [f"{_column(name)} = v.v_{name}" for name, _ in per_row[1:-1]]
            + [f"{_column('lease_owner')} = ''", f"{_column('lease_expires_at')} = NULL"]
            + [f"{_column('completed_at')} = %s"]
        )
        _fenced_sql["group"] = (
            f"UPDATE {table} AS t SET {assignments} "  # noqa: S608
            f"FROM unnest({arrays}) AS v({names}) "
            f"WHERE t.{_column('id')} = v.v_id AND t.{_column('state')} = %s "
            f"AND t.{_column('lease_owner')} = %s AND t.{_column('lease_token')} = v.v_lease_token "
            f"AND t.{_column('lease_expires_at')} > %s "
            f"RETURNING t.{_column('id')}"
        )
    return _fenced_sql["group"]


def _state_of(outcome: ItemOutcome) -> str:
    return BatchItem.State.SUCCEEDED if outcome.succeeded else BatchItem.State.FAILED


def _record_one(cursor: Any, o: ItemOutcome, worker_id: str, at: Any) -> bool:
    cursor.execute(
        _fenced_write_sql(),
        [
            # SET: what `_FENCED_WRITE` names, in its order
            str(_state_of(o)),
            o.result,
            o.error_code,
            o.prompt_tokens,
            o.cached_tokens if o.succeeded else 0,
            o.completion_tokens if o.succeeded else 0,
            o.reasoning_tokens if o.succeeded else 0,
            "",
            None,
            at,
            # WHERE: the fence (see the module doc)
            o.item.id,
            str(BatchItem.State.RUNNING),
            worker_id,
            o.item.lease_token,
            at,
        ],
    )
    return cursor.rowcount == 1
