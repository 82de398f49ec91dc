"""Build an offline demo model: `manage.py build_demo_model [--size tiny|bench] [--vision |
--audio] [--output DIR]`."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from inference.demo.model import SIZES, build_demo_model
from inference.demo.multimodal import build_audio_model, build_vision_model


class Command(BaseCommand):
    help = (
        "Build a random-weight demo model offline (idempotent) and print its directory: the "
        "chat model, or with --vision a tiny LLaVA, with --audio a tiny Qwen2-Audio."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
        kind = parser.add_mutually_exclusive_group()
        kind.add_argument("--vision", action="store_true", help="The tiny image model.")
        kind.add_argument("--audio", action="store_true", help="The tiny audio model.")
        parser.add_argument(
            "--output",
            type=Path,
            default=None,
            help="Target directory (default: MODELS_DIR/tiny-chat-<size>, tiny-vision or "
            "tiny-audio).",
        )

    def handle(
        self,
        *args: object,
        size: str,
        vision: bool,
        audio: bool,
        output: Path | None,
        **options: object,
    ) -> None:
        models = Path(settings.MODELS_DIR)
        if vision:
            path = build_vision_model(output or models / "tiny-vision")
        elif audio:
            path = build_audio_model(output or models / "tiny-audio")
        else:
            path = build_demo_model(output or models / f"tiny-chat-{size}", size=size)
        self.stdout.write(str(path))
