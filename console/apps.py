from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The staff console's own pages (usage dashboard, workers); no tables of its own."""

    name = "console"
    verbose_name = "Staff console"
