"""The revision's dialect replaces its tool-call format (docs/API.md "Model dialects").

Existing revisions keep what they did: "hermes" tool calls become the hermes dialect, a
revision without tools becomes plain. Going back keeps the hermes ones; the rest lose nothing
the old field could say.
"""

from django.db import migrations, models


def forwards(apps, schema_editor):
    revisions = apps.get_model("inference", "ModelRevision")
    revisions.objects.filter(tool_call_format="hermes").update(dialect="hermes")
    revisions.objects.exclude(tool_call_format="hermes").update(dialect="plain")


def backwards(apps, schema_editor):
    revisions = apps.get_model("inference", "ModelRevision")
    revisions.objects.filter(dialect="hermes").update(tool_call_format="hermes")
    revisions.objects.exclude(dialect="hermes").update(tool_call_format="")


class Migration(migrations.Migration):
    dependencies = [("inference", "0005_interactive_prices_optional_and_enabled")]

    operations = [
        migrations.AddField(
            model_name="modelrevision",
            name="dialect",
            field=models.CharField(
                default="plain",
                help_text='How the model writes reasoning, tool calls and the end of its turn '
                '(docs/API.md "Model dialects"); chosen from the chat template when the '
                "revision is created. A dialect without a tool syntax takes no `tools`.",
                max_length=32,
            ),
        ),
        migrations.RunPython(forwards, backwards),
        migrations.RemoveField(model_name="modelrevision", name="tool_call_format"),
    ]
