from django.apps import AppConfig


class ProjectConfig(AppConfig):
    """Holds the commands that start what every app runs in (`serve`, `run_worker`,
    `bootstrap_demo`); it has no models."""

    name = "project"
    verbose_name = "Wiring"
