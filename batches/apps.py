from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "batches"
    verbose_name = "Batches"

    def ready(self) -> None:
        from batches.metrics import collect
        from boardwalk.metrics import register_collector

        register_collector(collect)
