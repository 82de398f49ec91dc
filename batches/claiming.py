"""The claim's statements, as SQL built once per database vendor (`items_claim_group`).

A claim runs for every group of 16 items a worker takes, on the prepare thread of a process
whose other threads feed the engine and read its results. Through the ORM, a claim compiled
four querysets and built three model instances per row (the item, its batch and its input
file, joined): ~15 ms on PostgreSQL, of which the statements themselves were ~6. As plain
SQL, a claim is three statements (the organizations in turn, each one's share, the lease
with RETURNING the leased rows), and the batch rows come from a cache the caller keeps for
its run.

Only the model's own quoted table and column names are formatted into the SQL; every value
is a parameter.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.db import connection

from batches.models import Batch, BatchItem


@dataclass(frozen=True)
class ClaimStatements:
    orgs: str  # (org_id_key) of claimable items, earliest deadline first; LIMIT %s
    share: str  # (id, attempts) of one org's claimable items, locked; LIMIT %s
    rest: str  # the same over every org, but for the ids already chosen (`rest_sql`)
    lease: str  # the update of the ids in "{ids}", RETURNING the rows but for `result`


_statements: dict[str, ClaimStatements] = {}


def claim_statements() -> ClaimStatements:
    vendor = connection.vendor
    if vendor not in _statements:
        _statements[vendor] = _build()
    return _statements[vendor]


def claimable_params(revision_id: str, deployment_id: str, now: dt.datetime) -> list[Any]:
    """The values of the claimable conditions every statement starts with, in their order."""
    return [
        revision_id,
        deployment_id,
        str(BatchItem.State.PENDING),
        connection.ops.adapt_datetimefield_value(now),
        str(Batch.Status.IN_PROGRESS),
        "",
    ]


def placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def rest_sql(statements: ClaimStatements, excluded: int) -> str:
    """`rest` for `excluded` ids already chosen (parameters after the claimable ones)."""
    column = connection.ops.quote_name(BatchItem._meta.pk.column)  # type: ignore[union-attr]
    clause = f" AND i.{column} NOT IN ({placeholders(excluded)})" if excluded else ""
    return statements.rest.replace("{exclude}", clause)


def _build() -> ClaimStatements:
    quote = connection.ops.quote_name

    def item(name: str) -> str:
        return "i." + quote(BatchItem._meta.get_field(name).column)  # type: ignore[union-attr,arg-type]

    def batch(name: str) -> str:
        return "b." + quote(Batch._meta.get_field(name).column)  # type: ignore[union-attr,arg-type]

    items = quote(BatchItem._meta.db_table)
    batches = quote(Batch._meta.db_table)
    # What `batches.items._claimable` filters on, the same conditions in SQL.
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
    return ClaimStatements(
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
