"""Fewer indexes on batch items (issue 6): every result write updates `state`, so it is never
a HOT update and each index of the table takes a new entry for every row written.

Dropped: the foreign key's own index on `batch_id` and the one on `revision_id_key` (the
unique (batch, index) constraint and `item_claim_idx` lead with those columns), and on
PostgreSQL the `varchar_pattern_ops` twins of those and of the unique `request_id` and
`row_id` (they serve only `LIKE 'prefix%'`, which nothing asks of these ids). Dropping an
index is quick; nothing is rebuilt.
"""

import django.db.models.deletion
from django.db import migrations, models


def drop_pattern_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = apps.get_model("batches", "BatchItem")._meta.db_table
    for column in ("request_id", "row_id"):
        name = schema_editor._create_index_name(table, [column], suffix="_like")
        schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")


class Migration(migrations.Migration):
    dependencies = [
        ("batches", "0005_add_worker_session_lock"),
    ]

    operations = [
        migrations.AlterField(
            model_name="batchitem",
            name="batch",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="items",
                to="batches.batch",
            ),
        ),
        migrations.AlterField(
            model_name="batchitem",
            name="revision_id_key",
            field=models.CharField(max_length=40),
        ),
        migrations.RunPython(drop_pattern_indexes, migrations.RunPython.noop),
    ]
