import json as jsonlib

from django.core.management.base import BaseCommand

from boardwalk.services import org_create


class Command(BaseCommand):
    help = "Create an organization."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--json", action="store_true", help="Print one JSON line.")

    def handle(self, *args, name, json: bool = False, **options):
        org = org_create(name=name)
        if json:
            self.stdout.write(_dumps({"org_id": org.id, "name": org.name}))
        else:
            self.stdout.write(f"Created organization {org.name} ({org.id}).")


def _dumps(value: dict) -> str:
    return jsonlib.dumps(value, separators=(",", ":"))
