"""Interactive usage moves to its own column: every `req_…` in `batch_id` goes to `request_id`.

Until 0006, the ledger entries and usage events of an interactive request (/v1/chat/
completions) held its request id (`req_…`) in `batch_id`, told apart from batches (`batch_…`)
by that prefix. From now on `batch_id` names batches only, `request_id` interactive requests.

The ledger and the usage events are append-only by the code's own rule, not by the database:
no trigger refuses an UPDATE and no model `save()` guards one (billing.services and
billing.metering only ever insert; the admin shows both tables read-only). This migration is
the one place that rewrites existing rows, and it changes only where the subject's id is
stored: one queryset `.update()` a table (no `save()`, no signal), with no amount, kind,
quantity, idempotency key or date touched, so every balance, rollup and key reads the same
before and after. The idempotency keys keep their `hold:req_…` form: a request held before
this migration is settled, voided or swept after it under the same keys.

Reversible: the reverse moves every `request_id` back into `batch_id`.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations
from django.db.models import F, Q

# Interactive request ids (batches.interactive.service); batch ids are batch_….
REQUEST_PREFIX = "req_"
MODELS = ("LedgerEntry", "UsageEvent")


def requests_to_own_column(apps: Any, schema_editor: Any) -> None:
    for name in MODELS:
        model = apps.get_model("billing", name)
        model.objects.using(schema_editor.connection.alias).filter(
            batch_id__startswith=REQUEST_PREFIX
        ).update(request_id=F("batch_id"), batch_id="")


def requests_back_to_batch_id(apps: Any, schema_editor: Any) -> None:
    for name in MODELS:
        model = apps.get_model("billing", name)
        model.objects.using(schema_editor.connection.alias).filter(~Q(request_id="")).update(
            batch_id=F("request_id"), request_id=""
        )


class Migration(migrations.Migration):
    dependencies = [("billing", "0006_subject_request_id")]

    operations = [migrations.RunPython(requests_to_own_column, requests_back_to_batch_id)]
