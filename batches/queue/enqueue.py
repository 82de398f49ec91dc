"""Putting work in the queue: a new batch's items, written in one statement run."""

from __future__ import annotations

from typing import Any

from django.db import connection

from batches.models import BatchItem

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

    PostgreSQL gets COPY: executemany (psycopg's pipeline) was a few times slower for a
    batch's rows and now and then stalled for a tenth of a second or more; COPY did not.
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
