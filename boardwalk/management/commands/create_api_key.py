import json as jsonlib

from django.core.management.base import BaseCommand, CommandError

from boardwalk.errors import BoardwalkError
from boardwalk.selectors import organization_by_id_or_name
from boardwalk.services import api_key_create


class Command(BaseCommand):
    help = "Create an API key; the secret is printed once and never stored."

    def add_arguments(self, parser):
        parser.add_argument("--org", required=True, help="Organization id or name.")
        parser.add_argument("--scopes", default="inference:write,requests:read")
        parser.add_argument("--name", default="")
        parser.add_argument("--json", action="store_true", help="Print one JSON line.")

    def handle(self, *args, org, scopes, name, json: bool = False, **options):
        try:
            issued = api_key_create(org=organization_by_id_or_name(org), scopes=scopes, name=name)
        except BoardwalkError as exc:
            raise CommandError(exc.message) from exc
        payload = {
            "api_key": issued.secret,
            "prefix": issued.key.prefix,
            "scopes": issued.key.scopes,
        }
        if json:
            self.stdout.write(jsonlib.dumps(payload, separators=(",", ":")))
        else:
            self.stdout.write(
                f"API key (shown once): {issued.secret}\nScopes: {', '.join(issued.key.scopes)}"
            )
