from django.apps import AppConfig


class BoardwalkConfig(AppConfig):
    name = "boardwalk"
    verbose_name = "Organizations and API keys"
