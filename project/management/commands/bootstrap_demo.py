"""Idempotent demo set-up for the embedded default: org, demo model, deployment, credit, keys."""

import json as jsonlib

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import transaction

from billing.models import LedgerEntry
from billing.services import credit_grant
from boardwalk.models import Organization
from boardwalk.services import api_key_create
from inference.demo.model import build_demo_model, demo_revision_fields
from inference.demo.multimodal import (
    audio_revision_fields,
    build_audio_model,
    build_vision_model,
    vision_revision_fields,
)
from inference.models import CatalogModel, Deployment, ModelRevision
from inference.services import (
    catalog_model_create,
    catalog_model_set_revision,
    deployment_create,
    revision_create,
)

DEMO_ORG = "demo"
DEMO_MODEL = "boardwalk/tiny-chat"
# Batch media ["image"]; the demo's media models are in docs/API.md "Images and audio".
DEMO_VISION_MODEL = "boardwalk/tiny-vision"
DEMO_AUDIO_MODEL = "boardwalk/tiny-audio"  # batch media ["audio"]
DEMO_DEPLOYMENT = "demo-agent"
DEMO_PRICES = (150_000, 75_000, 600_000)  # µUSD per million tokens: input, cached, output
# Interactive requests pay these (flex ones DEMO_PRICES): each at least the batch price.
DEMO_INTERACTIVE_PRICES = (300_000, 150_000, 1_200_000)
DEMO_GPU_SECOND_PRICE = 400  # µUSD per GPU-second
DEMO_CREDIT = 100_000_000  # 100 USD


class Command(BaseCommand):
    help = "Create (or reuse) the demo organization, model, deployment and credit; issue keys."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="Print one JSON line.")
        parser.add_argument("--example", action="store_true", help="Print a curl walk-through.")
        parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
        parser.add_argument(
            "--model-size",
            "--size",
            dest="size",
            default="tiny",
            choices=["tiny", "bench"],
            help="tiny (~0.1M parameters, tests) or bench (~30M, benchmarks)",
        )

    def handle(
        self, *args, json: bool = False, example: bool = False, base_url: str, size: str, **options
    ):
        path = build_demo_model(settings.MODELS_DIR / f"tiny-chat-{size}", size=size)
        # Tiny whatever the size: they exist to try images and audio, not to benchmark.
        vision_path = build_vision_model(settings.MODELS_DIR / "tiny-vision")
        audio_path = build_audio_model(settings.MODELS_DIR / "tiny-audio")
        with transaction.atomic():
            org, _ = Organization.objects.get_or_create(name=DEMO_ORG)
            fields = demo_revision_fields(path, size)
            revision = ModelRevision.objects.filter(
                weights=fields["weights"], label=fields["label"]
            ).first() or revision_create(**fields)
            catalog = CatalogModel.objects.filter(name=DEMO_MODEL).first()
            if catalog is None:
                catalog_model_create(
                    name=DEMO_MODEL,
                    revision=revision,
                    prices=DEMO_PRICES,
                    interactive_prices=DEMO_INTERACTIVE_PRICES,
                )
            elif catalog.revision_id != revision.id:  # --model-size switched: serve that one
                catalog_model_set_revision(model=catalog, revision=revision)
            _media_model(DEMO_VISION_MODEL, vision_revision_fields(vision_path), ["image"])
            _media_model(DEMO_AUDIO_MODEL, audio_revision_fields(audio_path), ["audio"])
            if not Deployment.objects.filter(name=DEMO_DEPLOYMENT).exists():
                deployment_create(
                    org=org,
                    name=DEMO_DEPLOYMENT,
                    revision=revision,
                    gpu_second_price=DEMO_GPU_SECOND_PRICE,
                )
            if not LedgerEntry.objects.filter(
                org=org, kind=LedgerEntry.Kind.GRANT, memo="bootstrap"
            ).exists():
                credit_grant(org=org, amount_microusd=DEMO_CREDIT, memo="bootstrap")
            write_key = api_key_create(org=org, scopes="inference:write,requests:read", name="demo")
            read_key = api_key_create(org=org, scopes="requests:read", name="demo read-only")
        payload = {
            "org_id": org.id,
            "api_key": write_key.secret,
            "read_key": read_key.secret,
            "model": DEMO_MODEL,
            "deployment": DEMO_DEPLOYMENT,
            "vision_model": DEMO_VISION_MODEL,
            "audio_model": DEMO_AUDIO_MODEL,
        }
        if json:
            self.stdout.write(jsonlib.dumps(payload, separators=(",", ":")))
            return
        self.stdout.write(f"Demo organization {org.id} is ready with 100 USD of credit.")
        self.stdout.write(
            f"Models: {DEMO_MODEL} (text), {DEMO_VISION_MODEL} (images), "
            f"{DEMO_AUDIO_MODEL} (audio); deployment {DEMO_DEPLOYMENT}."
        )
        self.stdout.write(
            f"API key (inference:write, requests:read; shown once): {write_key.secret}"
        )
        self.stdout.write(f"Read-only key (requests:read; shown once):         {read_key.secret}")
        if example:
            example_text = (settings.BASE_DIR / "templates" / "bootstrap_example.txt").read_text()
            self.stdout.write(
                example_text.format(key=write_key.secret, base=base_url, model=DEMO_MODEL)
            )


def _media_model(name: str, fields: dict, media: list[str]) -> None:
    """The catalog entry `name` serving the demo media model of `fields` (created once)."""
    revision = ModelRevision.objects.filter(
        weights=fields["weights"], label=fields["label"]
    ).first() or revision_create(**fields)
    catalog = CatalogModel.objects.filter(name=name).first()
    if catalog is None:
        catalog_model_create(
            name=name,
            revision=revision,
            prices=DEMO_PRICES,
            media=media,
            interactive_prices=DEMO_INTERACTIVE_PRICES,
        )
    elif catalog.revision_id != revision.id:
        catalog_model_set_revision(model=catalog, revision=revision)
