from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("batches", "0007_end_open_items_of_terminal_batches")]

    operations = [
        migrations.AddField(
            model_name="workerprocess",
            name="device",
            field=models.CharField(
                blank=True, help_text="Where its engines run (run_worker --device).", max_length=32
            ),
        ),
    ]
