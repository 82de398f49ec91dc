"""Endpoints take the shape of the `openai` SDK's `client.webhooks` (docs/API.md "Webhooks"):
`events` becomes `event_types`, and an endpoint gains a name, `updated_at`, a secret hint and room
for a rotated secret kept for 24 hours. Existing rows keep their events and secret; their name is
their URL's host and their `updated_at` their `created_at`. Their hint stays empty (shown as null)
until the secret is rotated: it would need the master key, which a migration should not handle."""

from urllib.parse import urlsplit

import boardwalk.clock
from django.db import migrations, models
from django.db.models import F


def name_existing_endpoints(apps, schema_editor):
    WebhookEndpoint = apps.get_model("webhooks", "WebhookEndpoint")
    WebhookEndpoint.objects.update(updated_at=F("created_at"))
    for endpoint in WebhookEndpoint.objects.filter(name="").only("id", "url"):
        host = urlsplit(endpoint.url).hostname or endpoint.id
        WebhookEndpoint.objects.filter(id=endpoint.id).update(name=host[:128])


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0001_webhook_outbox"),
    ]

    operations = [
        migrations.RenameField(
            model_name="webhookendpoint", old_name="events", new_name="event_types"
        ),
        migrations.AddField(
            model_name="webhookendpoint",
            name="name",
            field=models.CharField(default="", max_length=128),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="webhookendpoint",
            name="updated_at",
            field=models.DateTimeField(default=boardwalk.clock.now),
        ),
        migrations.AddField(
            model_name="webhookendpoint",
            name="secret_hint",
            field=models.CharField(blank=True, max_length=32),
        ),
        migrations.AddField(
            model_name="webhookendpoint",
            name="previous_secret_key_id",
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name="webhookendpoint",
            name="previous_wrapped_secret",
            field=models.BinaryField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="webhookendpoint",
            name="previous_secret_expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(name_existing_endpoints, migrations.RunPython.noop),
    ]
