from django.core.management.base import BaseCommand, CommandError

from billing.selectors import credit_for_org
from billing.services import credit_grant
from boardwalk.errors import BoardwalkError
from boardwalk.selectors import organization_by_id_or_name


class Command(BaseCommand):
    help = "Grant credit (micro-USD) to an organization: an append-only ledger entry."

    def add_arguments(self, parser):
        parser.add_argument("--org", required=True, help="Organization id or name.")
        parser.add_argument("--microusd", type=int, required=True)
        parser.add_argument("--memo", default="")

    def handle(self, *args, org, microusd, memo, **options):
        try:
            organization = organization_by_id_or_name(org)
            credit_grant(org=organization, amount_microusd=microusd, memo=memo)
        except BoardwalkError as exc:
            raise CommandError(exc.message) from exc
        credit = credit_for_org(org_id=organization.id)
        self.stdout.write(
            f"Granted {microusd} µUSD to {organization.id}; available {credit.available} µUSD."
        )
