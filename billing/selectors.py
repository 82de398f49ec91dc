from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Sum

from billing.models import LedgerEntry


@dataclass(frozen=True)
class Credit:
    balance: int  # grants - charges
    held: int  # holds - releases

    @property
    def available(self) -> int:
        return self.balance - self.held


def credit_for_org(*, org_id: str) -> Credit:
    totals = {
        row["kind"]: int(row["total"] or 0)
        for row in LedgerEntry.objects.filter(org_id=org_id)
        .values("kind")
        .annotate(total=Sum("amount_microusd"))
    }
    K = LedgerEntry.Kind
    return Credit(
        balance=totals.get(K.GRANT, 0) - totals.get(K.CHARGE, 0),
        held=totals.get(K.HOLD, 0) - totals.get(K.RELEASE, 0),
    )
