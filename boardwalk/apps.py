from django.apps import AppConfig


class BoardwalkConfig(AppConfig):
    name = "boardwalk"
    verbose_name = "Organizations and API keys"

    def ready(self) -> None:
        # The broker must exist before any actor module is imported.
        from boardwalk.broker import setup_broker

        setup_broker()
