"""Durable work items: claim with a lease, heartbeat, complete under a fencing token.

Any number of workers on any number of machines cooperate through these functions alone
(DESIGN decisions 1 and 2). On PostgreSQL a claim skips rows other workers hold
(FOR UPDATE SKIP LOCKED); on SQLite the IMMEDIATE transaction makes each claim the only
writer, which is the correct single-writer path for the embedded default.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q, QuerySet

from batches.claiming import claim_statements, claimable_params, placeholders, rest_sql
from batches.models import Batch, BatchItem
from billing.metering import UsageFacts, seconds_to_microseconds, usage_record
from boardwalk import clock
from boardwalk.codes import ItemCode
from boardwalk.faultpoints import fault_point

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineKey:
    """Which engine serves an item: its revision, and for private batches its deployment."""

    revision_id: str
    deployment_id: str = ""


def _lease_until() -> dt.datetime:
    return clock.now() + dt.timedelta(seconds=settings.ITEM_LEASE_SECONDS)


@dataclass
class ClaimGroup:
    """What one claim did: the items now leased, and the batches of items it ended instead
    (out of attempts) — those batches may have no open item left."""

    items: list[BatchItem]
    ended_batch_ids: set[str]


def _claimable(
    key: EngineKey, now: dt.datetime, base: QuerySet[BatchItem] | None = None
) -> QuerySet[BatchItem]:
    return (BatchItem.objects.all() if base is None else base).filter(
        revision_id_key=key.revision_id,
        deployment_id_key=key.deployment_id,
        state=BatchItem.State.PENDING,
        deadline__gt=now,
        batch__status=Batch.Status.IN_PROGRESS,
        batch__outcome="",
    )


def _fair_candidates(key: EngineKey, now: dt.datetime, limit: int) -> list[tuple[int, int]]:
    """(id, attempts) of up to `limit` claimable items, locked, shared fairly between orgs.

    Organizations are taken in the order of their earliest deadline and each gets an equal
    share of the group (earliest deadline first within it); shares an org cannot fill go to
    the others in plain deadline order. So one org's large backlog delays another org's
    small batch by a claim group or two, not by the whole backlog (SPEC §11).
    """
    sql = claim_statements()
    where = claimable_params(key.revision_id, key.deployment_id, now)
    with connection.cursor() as cursor:
        cursor.execute(sql.orgs, [*where, limit])
        orgs = [org_id for (org_id,) in cursor.fetchall()]
        if not orgs:
            return []
        share = -(-limit // len(orgs))
        chosen: list[tuple[int, int]] = []
        for org_id in orgs:
            room = min(share, limit - len(chosen))
            if room <= 0:
                break
            cursor.execute(sql.share, [*where, org_id, room])
            chosen.extend(cursor.fetchall())
        # With one org its share was the whole group: there is nobody else to fill it from.
        if len(chosen) < limit and len(orgs) > 1:
            taken = [pk for pk, _ in chosen]
            cursor.execute(
                rest_sql(sql, len(taken)),
                [*where, *taken, limit - len(chosen)],
            )
            chosen.extend(cursor.fetchall())
    return chosen


def items_claim_group(
    *, key: EngineKey, worker_id: str, limit: int, batches: dict[str, Batch] | None = None
) -> ClaimGroup:
    """Lease up to `limit` pending items (fair between orgs, earliest deadline first).

    Each claim increments the item's lease_token: the fencing token its result must carry.
    An item that already used BOARDWALK_ITEM_MAX_ATTEMPTS claims is not leased again: it ends
    here as an `internal_error` row (a poison item that crashes whole workers stops looping).
    The items come with their batch and its input file (less its line index and counts);
    `batches`, a cache the caller keeps across its claims, saves reading the same batch again
    (what a claimed item reads of it does not change once the batch is accepted).
    """
    now = clock.now()
    with transaction.atomic():
        chosen = _fair_candidates(key, now, limit)
        if not chosen:
            return ClaimGroup([], set())
        spent = [pk for pk, attempts in chosen if attempts >= settings.ITEM_MAX_ATTEMPTS]
        ids = [pk for pk, attempts in chosen if attempts < settings.ITEM_MAX_ATTEMPTS]
        ended: set[str] = set()
        if spent:
            BatchItem.objects.filter(id__in=spent, state=BatchItem.State.PENDING).update(
                state=BatchItem.State.FAILED,
                error_code=ItemCode.INTERNAL_ERROR,
                lease_token=F("lease_token") + 1,
                completed_at=now,
            )
            ended = set(BatchItem.objects.filter(id__in=spent).values_list("batch_id", flat=True))
            logger.warning("%s item(s) out of attempts ended as internal_error", len(spent))
        if not ids:
            return ClaimGroup([], ended)
        fault_point("items_claim.locked")  # test only: the candidates are row-locked here
        adapt = connection.ops.adapt_datetimefield_value
        # raw() for the rows an UPDATE … RETURNING gives back: it converts each column the
        # way a query does (SQLite's datetimes are text) and builds the model instances.
        items = list(
            BatchItem.objects.raw(
                claim_statements().lease.replace("{ids}", placeholders(len(ids))),
                [
                    str(BatchItem.State.RUNNING),
                    worker_id,
                    adapt(_lease_until()),
                    adapt(now),
                    *ids,
                    str(BatchItem.State.PENDING),
                ],
            )
        )
        _attach_batches(items, {} if batches is None else batches)
        items.sort(key=lambda i: (i.deadline, i.batch_id, i.index))
        return ClaimGroup(items, ended)


def _attach_batches(items: list[BatchItem], known: dict[str, Batch]) -> None:
    missing = {item.batch_id for item in items} - known.keys()
    if missing:
        known.update(
            Batch.objects.select_related("input_file")
            # The input file's per-line index and token counts are JSON as long as the
            # file, and the claimed items need neither.
            .defer("input_file__line_index", "input_file__prompt_tokens")
            .in_bulk(missing)
        )
    for item in items:
        item.batch = known[item.batch_id]


def items_claim(*, key: EngineKey, worker_id: str, limit: int) -> list[BatchItem]:
    """`items_claim_group`'s leased items."""
    return items_claim_group(key=key, worker_id=worker_id, limit=limit).items


def items_heartbeat(*, worker_id: str, item_ids: list[int]) -> int:
    """Extend the leases this worker still holds; returns how many it still holds."""
    if not item_ids:
        return 0
    return BatchItem.objects.filter(
        id__in=item_ids, lease_owner=worker_id, state=BatchItem.State.RUNNING
    ).update(lease_expires_at=_lease_until())


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


# The columns a fenced write sets, in the order items_record passes their values.
_FENCED_WRITE = (
    "state",
    "result",
    "error_code",
    "usage_prompt_tokens",
    "usage_cached_tokens",
    "usage_completion_tokens",
    "lease_owner",
    "lease_expires_at",
    "completed_at",
)
_fenced_sql: dict[str, str] = {}


# Values of these field types need no preparation when they already are plain ints/strs.
_PLAIN_FIELDS = {
    "BigIntegerField",
    "CharField",
    "IntegerField",
    "PositiveBigIntegerField",
    "PositiveIntegerField",
    "PositiveSmallIntegerField",
}


def items_insert(*, shared: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Insert a new batch's items: one COPY on PostgreSQL, one prepared INSERT run for every
    row elsewhere (executemany).

    `shared`: the column values every item has (its batch, engine keys, deadline), by field
    attname; `rows`: each item's own values (the same attnames in every row). Other columns
    take their defaults, a callable one (the request and row ids) called per row. Shared
    values and plain defaults are prepared for the database once, a row's ints and strings
    not at all: building model instances and preparing every value of every row (`bulk_create`,
    then `get_db_prep_save` per value) was the larger part of a 256-line batch's acceptance.
    The items' own ids stay unset.

    PostgreSQL gets COPY: 256 rows took ~20 ms through executemany (psycopg's pipeline), and
    one call in 30 to 60 stalled for ~200 ms, against ~6 ms through COPY, with no stall seen.
    """
    if not rows:
        return
    fields = [f for f in BatchItem._meta.concrete_fields if not f.primary_key]
    own = rows[0].keys()
    constant: dict[str, Any] = {}
    for f in fields:
        # A field without a default has NOT_PROVIDED there, a class: callable, yet constant.
        per_row_default = f.has_default() and callable(f.default)
        if f.attname in own or (f.attname not in shared and per_row_default):
            continue
        fixed = shared[f.attname] if f.attname in shared else f.get_default()
        constant[f.attname] = f.get_db_prep_save(fixed, connection)
    # The constant values fill a template row once. Per field of a row's own or with a
    # callable default, decided once: (position, field, its attname, a row's own value?,
    # plain: an int, a str or None goes to the database as it is).
    template = [constant.get(f.attname) for f in fields]
    varying = [
        (position, f, f.attname, f.attname in own, f.get_internal_type() in _PLAIN_FIELDS)
        for position, f in enumerate(fields)
        if f.attname not in constant
    ]

    def prepared(row: dict[str, Any]) -> list[Any]:
        values = template.copy()
        for position, f, name, from_row, plain in varying:
            raw = row[name] if from_row else f.get_default()
            if plain and (raw is None or type(raw) in (int, str)):
                values[position] = raw
            else:
                values[position] = f.get_db_prep_save(raw, connection)
        return values

    quote = connection.ops.quote_name
    table = quote(BatchItem._meta.db_table)
    columns = ", ".join(quote(f.column) for f in fields)
    values = (prepared(row) for row in rows)
    # Only the model's own quoted table and column names are formatted in.
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row_values in values:
                    copy.write_row(row_values)
            return
        marks = ", ".join(["%s"] * len(fields))
        cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", list(values))  # noqa: S608


def items_set_charges(charges: dict[int, int]) -> None:
    """Each published item's charge (finalization): on PostgreSQL one statement over two
    arrays, elsewhere one statement run per row. The ORM's `bulk_update` built a CASE over
    every row (~90 ms of Python for 256 rows); executemany on PostgreSQL stalls now and then
    (see `items_insert`)."""
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


def _fenced_write_sql() -> str:
    """The fenced write of one finished row, as SQL built once per database vendor.

    The row is written only while this worker's lease on it is current and unexpired: the
    compare-and-set on (state, owner, token) fences off a worker whose item was re-claimed or
    whose batch stopped; the expiry check fences off one that paused past its lease although
    nobody has re-claimed the item yet. Plain SQL because the same ORM update, compiled per
    row, cost ~0.5 ms of Python each (under the GIL the engine thread needs), more than the
    statement itself.
    """
    vendor = connection.vendor
    if vendor not in _fenced_sql:
        quote = connection.ops.quote_name

        def column(name: str) -> str:
            return quote(BatchItem._meta.get_field(name).column)  # type: ignore[union-attr,arg-type]

        assignments = ", ".join(f"{column(name)} = %s" for name in _FENCED_WRITE)
        fence = " AND ".join(
            f"{column(n)} = %s" for n in ("id", "state", "lease_owner", "lease_token")
        )
        table = quote(BatchItem._meta.db_table)
        # Only the model's own quoted table and column names are formatted in; every value
        # is a parameter.
        _fenced_sql[vendor] = (
            f"UPDATE {table} SET {assignments} "  # noqa: S608
            f"WHERE {fence} AND {column('lease_expires_at')} > %s"
        )
    return _fenced_sql[vendor]


def _fenced_group_sql() -> str:
    """The fenced write of a whole group on PostgreSQL: one statement over arrays (one per
    column), under the same fence per row as `_fenced_write_sql`, RETURNING the ids written.
    One statement per row cost ~0.35 ms each, on the record thread and the database's core."""
    if "group" not in _fenced_sql:
        quote = connection.ops.quote_name

        def column(name: str) -> str:
            return quote(BatchItem._meta.get_field(name).column)  # type: ignore[union-attr,arg-type]

        table = quote(BatchItem._meta.db_table)
        per_row = (
            ("id", "bigint"),
            ("state", "text"),
            ("result", "bytea"),
            ("error_code", "text"),
            ("usage_prompt_tokens", "integer"),
            ("usage_cached_tokens", "integer"),
            ("usage_completion_tokens", "integer"),
            ("lease_token", "bigint"),
        )
        arrays = ", ".join(f"%s::{kind}[]" for _, kind in per_row)
        names = ", ".join(f"v_{name}" for name, _ in per_row)
        assignments = ", ".join(
            [f"{column(name)} = v.v_{name}" for name, _ in per_row[1:7]]
            + [f"{column('lease_owner')} = ''", f"{column('lease_expires_at')} = NULL"]
            + [f"{column('completed_at')} = %s"]
        )
        _fenced_sql["group"] = (
            f"UPDATE {table} AS t SET {assignments} "  # noqa: S608
            f"FROM unnest({arrays}) AS v({names}) "
            f"WHERE t.{column('id')} = v.v_id AND t.{column('state')} = %s "
            f"AND t.{column('lease_owner')} = %s AND t.{column('lease_token')} = v.v_lease_token "
            f"AND t.{column('lease_expires_at')} > %s "
            f"RETURNING t.{column('id')}"
        )
    return _fenced_sql["group"]


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
    transaction with the outcomes that were written (per-item usage facts). On PostgreSQL
    the group is one statement (`_fenced_group_sql`), elsewhere one per row.
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
            "",
            None,
            at,
            # WHERE: the fence (see _fenced_write_sql)
            o.item.id,
            str(BatchItem.State.RUNNING),
            worker_id,
            o.item.lease_token,
            at,
        ],
    )
    return cursor.rowcount == 1


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

    The GPU time becomes a usage event in the transaction that hands the lease back, under
    the same fence: deployments pay for aborted work (SPEC §8), and only once. False if the
    lease was lost already (nothing is handed back, nothing metered).
    """
    with transaction.atomic():
        released = BatchItem.objects.filter(
            id=item.id,
            state=BatchItem.State.RUNNING,
            lease_owner=worker_id,
            lease_token=item.lease_token,
        ).update(state=BatchItem.State.PENDING, lease_owner="", lease_expires_at=None)
        if released:
            usage_record(
                facts=[
                    UsageFacts(
                        org_id=item.org_id_key,
                        batch_id=item.batch_id,
                        item_id=item.pk,
                        attempt=item.lease_token,
                        revision_id=item.revision_id_key,
                        deployment_id=item.deployment_id_key,
                        outcome="released",
                        gpu_microseconds=seconds_to_microseconds(gpu_seconds),
                    )
                ]
            )
    return bool(released)


def batch_has_open_items(*, batch_id: str) -> bool:
    return BatchItem.objects.open().filter(batch_id=batch_id).exists()


def batches_without_open_items(*, batch_ids: Iterable[str]) -> set[str]:
    """Which of these batches have no pending or running item left (one query)."""
    wanted = set(batch_ids)
    if not wanted:
        return set()
    open_ = set(
        BatchItem.objects.open()
        .filter(batch_id__in=wanted)
        .values_list("batch_id", flat=True)
        .distinct()
    )
    return wanted - open_


def batch_live_leases(*, batch_id: str) -> int:
    return BatchItem.objects.filter(
        batch_id=batch_id, state=BatchItem.State.RUNNING, lease_expires_at__gt=clock.now()
    ).count()


def batch_revoke_leases(*, batch_id: str) -> int:
    """Fence off every running item of a batch that is stopping (cancel, expiry, failure)."""
    return BatchItem.objects.filter(batch_id=batch_id, state=BatchItem.State.RUNNING).update(
        state=BatchItem.State.PENDING,
        lease_owner="",
        lease_expires_at=None,
        lease_token=F("lease_token") + 1,
    )


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


def leases_recover(*, dead_processes: Iterable[str] = (), expired: bool = True) -> tuple[int, int]:
    """Return abandoned items to the queue; fail those out of attempts.

    Abandoned: the lease expired (unless `expired=False`), or the lease belongs to a worker
    process that stopped stamping its liveness row (`dead_processes`, see batches.liveness).
    Returns (requeued, failed). A crashed worker's items are retried by whoever claims next.
    """
    now = clock.now()
    abandoned = Q(lease_expires_at__lte=now) if expired else Q(pk__in=[])
    for process in dead_processes:
        abandoned |= Q(lease_owner__startswith=f"{process}:")
    running = Q(state=BatchItem.State.RUNNING) & abandoned
    failed = BatchItem.objects.filter(running, attempts__gte=settings.ITEM_MAX_ATTEMPTS).update(
        state=BatchItem.State.FAILED,
        error_code=ItemCode.INTERNAL_ERROR,
        lease_owner="",
        lease_expires_at=None,
        lease_token=F("lease_token") + 1,
        completed_at=now,
    )
    requeued = BatchItem.objects.filter(running).update(
        state=BatchItem.State.PENDING,
        lease_owner="",
        lease_expires_at=None,
        lease_token=F("lease_token") + 1,
    )
    if requeued or failed:
        logger.warning("lease recovery requeued=%s failed=%s", requeued, failed)
    return requeued, failed


def key_has_claimable_items(key: EngineKey) -> bool:
    """One indexed existence query: whether a wake-up for `key` has anything to claim."""
    return _claimable(key, clock.now()).exists()


def keys_with_claimable_items() -> set[EngineKey]:
    rows = (
        BatchItem.objects.filter(
            state=BatchItem.State.PENDING,
            batch__status=Batch.Status.IN_PROGRESS,
            batch__outcome="",
            deadline__gt=clock.now(),
        )
        .values_list("revision_id_key", "deployment_id_key")
        .distinct()
    )
    return {EngineKey(rev, dep) for rev, dep in rows}
