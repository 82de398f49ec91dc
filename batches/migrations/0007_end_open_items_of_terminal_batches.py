"""End the items that batches already terminal left open.

Before this, a cancelled, expired or failed batch was published with its unrun items still
`pending` (or `running`, fenced): they never ran again, but every count of queued work saw
them (`/metrics` queue depth, the dashboard, the create-time `queue_backlog_full` check).
Finalization now ends them `failed` with the batch's stop code; this does the same for the
batches finalized before it. Idempotent: a second run finds nothing open.
"""

from django.db import migrations
from django.db.models import F
from django.utils import timezone

STOP_CODES = {"cancelled": "batch_cancelled", "expired": "batch_expired", "failed": "batch_failed"}


def end_open_items(apps, schema_editor):
    BatchItem = apps.get_model("batches", "BatchItem")
    now = timezone.now()
    for status, code in [*STOP_CODES.items(), ("completed", "internal_error")]:
        BatchItem.objects.filter(
            batch__status=status, state__in=("pending", "running")
        ).update(
            state="failed",
            error_code=code,
            lease_owner="",
            lease_expires_at=None,
            lease_token=F("lease_token") + 1,
            completed_at=now,
        )


class Migration(migrations.Migration):
    dependencies = [("batches", "0006_fewer_item_indexes")]

    operations = [migrations.RunPython(end_open_items, migrations.RunPython.noop)]
