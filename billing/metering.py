"""Metering: usage facts as append-only integer events, and their hourly rollup.

Callers write facts inside the transaction that records the item they belong to (batches'
record stage, under the item's fencing token), so usage commits or rolls back with the
result itself. The hourly rollup the dashboard reads is updated in that same transaction,
and settled spend is added to it in the transaction that appends the ledger's charge.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from django.db import connection, transaction
from django.db.models import Sum

from billing.models import UsageEvent, UsageRollup
from boardwalk import clock

# "cut": an interactive request stopped before its end (its client went away, its stream
# broke): its tokens so far count and are charged, but it neither succeeded nor failed.
Outcome = Literal["succeeded", "failed", "released", "cut"]
_TOKENS_COUNT: tuple[Outcome, ...] = ("succeeded", "cut")
# Which tier the usage belongs to: batch rows, or interactive requests (/v1/chat/completions).
UsageClass = Literal["batch", "interactive"]
# The summed columns of UsageRollup (the console reads the same list).
ROLLUP_SUMS = (
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "reasoning_tokens",
    "gpu_microseconds",
    "items_succeeded",
    "items_failed",
    "spend_microusd",
)


@dataclass(frozen=True, kw_only=True)
class UsageFacts:
    """One item attempt's usage (ids and counts only, never content).

    Whose: a batch's item (`batch_id`), or an interactive request (`request_id`, class
    "interactive"); exactly one of the two (the events' `usage_event_one_subject`).

    `attempt` is the lease token the item was written under. Tokens count only for a succeeded row
    (the rows that can be published and charged) and a cut interactive request (charged what it
    generated before it stopped); GPU time counts for every outcome, since deployments pay for work
    that ended in a failure or a cancel (docs/API.md "Billing"). `reasoning_tokens` is the part of
    `completion_tokens` the model spent reasoning: a detail of the output, counted on its own and
    charged as output, never on top of it.
    """

    org_id: str
    batch_id: str = ""
    request_id: str = ""
    item_id: int
    attempt: int
    revision_id: str
    deployment_id: str
    outcome: Outcome
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    gpu_microseconds: int = 0
    usage_class: UsageClass = "batch"


def seconds_to_microseconds(seconds: float) -> int:
    """The engine's float busy time as the integer the events hold (a measurement, not money)."""
    return max(0, int(seconds * 1_000_000 + 0.5))


def hour_of(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


# The columns of an event row, in the order `_event_rows` gives their values.
_EVENT_COLUMNS = (
    "org_id",
    "batch_id",
    "request_id",
    "item_id",
    "attempt",
    "revision_id",
    "deployment_id",
    "kind",
    "quantity",
    "usage_class",
    "created_at",
)
_EVENTS_PER_STATEMENT = 500


def _event_rows(facts: Iterable[UsageFacts], at: Any) -> list[tuple[Any, ...]]:
    K = UsageEvent.Kind
    rows = []
    for f in facts:
        tokens = f.outcome in _TOKENS_COUNT
        for kind, quantity in (
            (K.INPUT_TOKENS, f.prompt_tokens if tokens else 0),
            (K.CACHED_TOKENS, f.cached_tokens if tokens else 0),
            (K.OUTPUT_TOKENS, f.completion_tokens if tokens else 0),
            (K.REASONING_TOKENS, f.reasoning_tokens if tokens else 0),
            (K.GPU_MICROSECONDS, f.gpu_microseconds),
        ):
            if quantity > 0:
                rows.append(
                    (
                        f.org_id,
                        f.batch_id,
                        f.request_id,
                        f.item_id,
                        f.attempt,
                        f.revision_id,
                        f.deployment_id,
                        str(kind),
                        quantity,
                        f.usage_class,
                        at,
                    )
                )
    return rows


def _events_insert(facts: Iterable[UsageFacts], now: dt.datetime) -> None:
    """Append the facts' events: one multi-row INSERT of plain values per 500 events.

    `bulk_create` built a model instance per event and prepared each of its values, up to
    four events per item: most of the record stage's own time went there.
    """
    rows = _event_rows(facts, connection.ops.adapt_datetimefield_value(now))
    quote = connection.ops.quote_name
    table = quote(UsageEvent._meta.db_table)
    columns = ", ".join(quote(UsageEvent._meta.get_field(c).column) for c in _EVENT_COLUMNS)  # type: ignore[union-attr,arg-type]
    one = "(" + ", ".join(["%s"] * len(_EVENT_COLUMNS)) + ")"
    with connection.cursor() as cursor:
        for start in range(0, len(rows), _EVENTS_PER_STATEMENT):
            chunk = rows[start : start + _EVENTS_PER_STATEMENT]
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES "  # noqa: S608 (names are ours)
                + ", ".join([one] * len(chunk)),
                [value for row in chunk for value in row],
            )


RollupKey = tuple[dt.datetime, str, str, str, str]  # bucket, org, revision, deployment, class


def _rollup_add(rows: dict[RollupKey, dict[str, int]]) -> None:
    """Add sums into the hourly rollup: one upsert statement for every key.

    Keys are written in sorted order, so two transactions touching the same keys lock them
    in the same order and cannot deadlock. `INSERT … ON CONFLICT DO UPDATE` reads the same
    on SQLite and PostgreSQL.
    """
    if not rows:
        return
    table = UsageRollup._meta.db_table
    columns = ("bucket", "org_id", "revision_id", "deployment_id", "usage_class", *ROLLUP_SUMS)
    adapt = connection.ops.adapt_datetimefield_value
    params: list[Any] = []
    for key in sorted(rows):
        bucket, org_id, revision_id, deployment_id, usage_class = key
        params.extend([adapt(bucket), org_id, revision_id, deployment_id, usage_class])
        params.extend(rows[key].get(name, 0) for name in ROLLUP_SUMS)
    one = "(" + ", ".join(["%s"] * len(columns)) + ")"
    sql = (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES "  # noqa: S608 (names are ours)
        + ", ".join([one] * len(rows))
        + " ON CONFLICT (bucket, org_id, revision_id, deployment_id, usage_class) DO UPDATE SET "
        + ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in ROLLUP_SUMS)
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def usage_record(*, facts: list[UsageFacts]) -> None:
    """Append the events of these item attempts and add them to the rollup.

    The caller runs inside the transaction that wrote the items under their fencing token.
    A second record of the same attempt violates `usage_event_once` and rolls that
    transaction back: double counting is impossible, not merely unlikely.
    """
    if not facts:
        return
    now = clock.now()
    bucket = hour_of(now)
    sums: dict[RollupKey, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for f in facts:
        row = sums[(bucket, f.org_id, f.revision_id, f.deployment_id, f.usage_class)]
        if f.outcome in _TOKENS_COUNT:
            row["input_tokens"] += f.prompt_tokens
            row["cached_tokens"] += f.cached_tokens
            row["output_tokens"] += f.completion_tokens
            row["reasoning_tokens"] += f.reasoning_tokens
        if f.outcome == "succeeded":
            row["items_succeeded"] += 1
        elif f.outcome == "failed":
            row["items_failed"] += 1
        row["gpu_microseconds"] += f.gpu_microseconds
    with transaction.atomic():
        _events_insert(facts, now)
        _rollup_add(sums)


def spend_record(
    *,
    org_id: str,
    revision_id: str,
    deployment_id: str,
    amount_microusd: int,
    at: dt.datetime,
    usage_class: UsageClass = "batch",
) -> None:
    """Add a settled charge (or, negative, a refund) to the rollup; the caller appended its
    ledger entry just now."""
    if amount_microusd != 0:
        key = (hour_of(at), org_id, revision_id, deployment_id, usage_class)
        _rollup_add({key: {"spend_microusd": amount_microusd}})


def gpu_microseconds_by_item(*, batch_id: str) -> dict[int, int]:
    """Every item's GPU time over all its attempts, from the events: what deployments pay."""
    rows = (
        UsageEvent.objects.filter(batch_id=batch_id, kind=UsageEvent.Kind.GPU_MICROSECONDS)
        .values("item_id")
        .annotate(total=Sum("quantity"))
        .values_list("item_id", "total")
    )
    return {item_id: int(total) for item_id, total in rows}
