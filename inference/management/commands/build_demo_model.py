"""Build the offline demo model: `manage.py build_demo_model [--size tiny|bench] [--output DIR]`."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from inference.demo_model import SIZES, build_demo_model


class Command(BaseCommand):
    help = "Build the random-weight demo chat model offline (idempotent) and print its directory."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
        parser.add_argument(
            "--output",
            type=Path,
            default=None,
            help="Target directory (default: MODELS_DIR/tiny-chat-<size>).",
        )

    def handle(self, *args: object, size: str, output: Path | None, **options: object) -> None:
        out_dir = output or Path(settings.MODELS_DIR) / f"tiny-chat-{size}"
        path = build_demo_model(out_dir, size=size)
        self.stdout.write(str(path))
