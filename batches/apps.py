from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "batches"
    verbose_name = "Batches"

    def ready(self) -> None:
        import batches.interactive.tasks  # noqa: F401 (declares its actor in every process)
        from batches.metrics import collect
        from boardwalk.metrics import register_collector

        register_collector(collect)
