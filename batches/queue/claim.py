"""Claiming work: a fair group of items under a lease, and the heartbeat that keeps it.

Any number of workers on any number of machines cooperate through the queue alone
(docs/ARCHITECTURE.md decisions 1 and 2). On PostgreSQL a claim skips rows other workers hold (FOR
UPDATE SKIP LOCKED); on SQLite the IMMEDIATE transaction makes each claim the only writer, which is
the correct single-writer path for the embedded default.

A claim runs for every group of 16 items a worker takes, on the thread that feeds the engine.
Through the ORM it compiled four querysets and built three model instances per row (the item,
its batch and its input file, joined), more than twice the statements' own time. So a claim
is three plain statements built once per database vendor (the organizations in turn, each
one's share, the lease with RETURNING the leased rows), and the batch rows come from a cache
the caller keeps for its run. Only the model's own quoted table and column names are
formatted into the SQL; every value is a parameter.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F

from batches.models import Batch, BatchItem
from batches.queue.queries import EngineKey
from boardwalk import clock
from boardwalk.codes import ItemCode
from boardwalk.faultpoints import fault_point
from boardwalk.logs import exception_trace

logger = logging.getLogger(__name__)


def lease_until() -> dt.datetime:
    return clock.now() + dt.timedelta(seconds=settings.ITEM_LEASE_SECONDS)


@dataclass
class ClaimGroup:
    """What one claim did: the items now leased, and the batches of items it ended instead
    (out of attempts) — those batches may have no open item left."""

    items: list[BatchItem]
    ended_batch_ids: set[str]


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
                _statements().lease.replace("{ids}", _placeholders(len(ids))),
                [
                    str(BatchItem.State.RUNNING),
                    worker_id,
                    adapt(lease_until()),
                    adapt(now),
                    *ids,
                    str(BatchItem.State.PENDING),
                ],
            )
        )
        _attach_batches(items, {} if batches is None else batches)
        items.sort(key=lambda i: (i.deadline, i.batch_id, i.index))
        return ClaimGroup(items, ended)


def items_claim(*, key: EngineKey, worker_id: str, limit: int) -> list[BatchItem]:
    """`items_claim_group`'s leased items."""
    return items_claim_group(key=key, worker_id=worker_id, limit=limit).items


def items_heartbeat(*, worker_id: str, item_ids: list[int]) -> int:
    """Extend the leases this worker still holds; returns how many it still holds."""
    if not item_ids:
        return 0
    return (
        BatchItem.objects.running()
        .filter(id__in=item_ids, lease_owner=worker_id)
        .update(lease_expires_at=lease_until())
    )


class LeaseHolder(Protocol):
    """What a heartbeat keeps alive: the leases `owner` holds on the items `held_ids()`."""

    owner: str

    def held_ids(self) -> list[int]: ...


class LeaseHeartbeat(threading.Thread):
    """Extends the leases `holder` holds (a run) until stopped.

    A database error costs one beat, never the thread: it logs the error's type, drops the
    broken connection and tries again at the next interval.
    """

    def __init__(self, holder: LeaseHolder) -> None:
        super().__init__(daemon=True, name="lease-heartbeat")
        self.holder = holder
        self.stopped = threading.Event()

    def run(self) -> None:
        interval = max(1.0, settings.ITEM_LEASE_SECONDS / 3)
        try:
            while not self.stopped.wait(interval):
                try:
                    items_heartbeat(worker_id=self.holder.owner, item_ids=self.holder.held_ids())
                except Exception as exc:
                    logger.warning("lease heartbeat failed; retrying: %s", exception_trace(exc))
                    connection.close()
        finally:
            connection.close()


def _fair_candidates(key: EngineKey, now: dt.datetime, limit: int) -> list[tuple[int, int]]:
    """(id, attempts) of up to `limit` claimable items, locked, shared fairly between orgs.

    Organizations are taken in the order of their earliest deadline and each gets an equal
    share of the group (earliest deadline first within it); shares an org cannot fill go to
    the others in plain deadline order. So one org's large backlog delays another org's
    small batch by a claim group or two, not by the whole backlog (docs/API.md "Batches").
    """
    sql = _statements()
    where = _claimable_params(key.revision_id, key.deployment_id, now)
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
                _rest_sql(sql, len(taken)),
                [*where, *taken, limit - len(chosen)],
            )
            chosen.extend(cursor.fetchall())
    return chosen


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


# -- the claim's statements ------------------------------------------------------------------


@dataclass(frozen=True)
class _ClaimStatements:
    orgs: str  # (org_id_key) of claimable items, earliest deadline first; LIMIT %s
    share: str  # (id, attempts) of one org's claimable items, locked; LIMIT %s
    rest: str  # the same over every org, but for the ids already chosen (`_rest_sql`)
    lease: str  # the update of the ids in "{ids}", RETURNING the rows but for `result`


_built: dict[str, _ClaimStatements] = {}


def _statements() -> _ClaimStatements:
    vendor = connection.vendor
    if vendor not in _built:
        _built[vendor] = _build()
    return _built[vendor]


def _claimable_params(revision_id: str, deployment_id: str, now: dt.datetime) -> list[Any]:
    """The values of the claimable conditions every statement starts with, in their order."""
    return [
        revision_id,
        deployment_id,
        str(BatchItem.State.PENDING),
        connection.ops.adapt_datetimefield_value(now),
        str(Batch.Status.IN_PROGRESS),
        "",
    ]


def _placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def _rest_sql(statements: _ClaimStatements, excluded: int) -> str:
    """`rest` for `excluded` ids already chosen (parameters after the claimable ones)."""
    column = connection.ops.quote_name(BatchItem._meta.pk.column)  # type: ignore[union-attr]
    clause = f" AND i.{column} NOT IN ({_placeholders(excluded)})" if excluded else ""
    return statements.rest.replace("{exclude}", clause)


def _build() -> _ClaimStatements:
    quote = connection.ops.quote_name

    def item(name: str) -> str:
        return "i." + quote(BatchItem._meta.get_field(name).column)  # type: ignore[union-attr,arg-type]

    def batch(name: str) -> str:
        return "b." + quote(Batch._meta.get_field(name).column)  # type: ignore[union-attr,arg-type]

    items = quote(BatchItem._meta.db_table)
    batches = quote(Batch._meta.db_table)
    # What `BatchItem.objects.claimable` filters on, for one engine key, in SQL.
    claimable = (
        f"FROM {items} i INNER JOIN {batches} b ON {item('batch')} = {batch('id')} "
        f"WHERE {item('revision_id_key')} = %s AND {item('deployment_id_key')} = %s "
        f"AND {item('state')} = %s AND {item('deadline')} > %s "
        f"AND {batch('status')} = %s AND {batch('outcome')} = %s"
    )
    order = f"ORDER BY {item('deadline')}, {item('batch')}, {item('index')}"
    # PostgreSQL skips the rows other workers hold; SQLite has no row locks, and its
    # IMMEDIATE transaction makes the claim the only writer (settings.DATABASES).
    lock = " FOR UPDATE OF i SKIP LOCKED" if connection.features.has_select_for_update else ""
    pick = f"SELECT {item('id')}, {item('attempts')} {claimable}"
    column = {f.name: quote(f.column) for f in BatchItem._meta.concrete_fields}
    leased = ("state", "lease_owner", "lease_expires_at", "started_at")
    setting = ", ".join(f"{column[name]} = %s" for name in leased)
    # A pending row has no result; the rest is what the claimed item needs.
    returned = ", ".join(c for name, c in column.items() if name != "result")
    return _ClaimStatements(
        orgs=(
            f"SELECT {item('org_id_key')} {claimable} GROUP BY {item('org_id_key')} "
            f"ORDER BY MIN({item('deadline')}), {item('org_id_key')} LIMIT %s"
        ),
        share=f"{pick} AND {item('org_id_key')} = %s {order} LIMIT %s{lock}",
        rest=f"{pick}{{exclude}} {order} LIMIT %s{lock}",
        lease=(
            f"UPDATE {items} SET {setting}, "  # noqa: S608
            f"{column['lease_token']} = {column['lease_token']} + 1, "
            f"{column['attempts']} = {column['attempts']} + 1 "
            f"WHERE {column['id']} IN ({{ids}}) AND {column['state']} = %s "
            f"RETURNING {returned}"
        ),
    )
