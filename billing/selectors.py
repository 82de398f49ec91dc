from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db.models import Sum

from billing.models import LedgerEntry, UsageRollup
from boardwalk import clock

# Below this much history a revision's measured cost is noise: holds use the setting.
MEASURED_COST_MIN_TOKENS = 10_000
MEASURED_COST_WINDOW = dt.timedelta(days=7)


@dataclass(frozen=True)
class Credit:
    balance: int  # grants + refunds - charges
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
        balance=totals.get(K.GRANT, 0) + totals.get(K.REFUND, 0) - totals.get(K.CHARGE, 0),
        held=totals.get(K.HOLD, 0) - totals.get(K.RELEASE, 0),
    )


def revision_gpu_microseconds_per_token(*, revision_id: str) -> int | None:
    """What a token costs this revision in GPU time, measured over the last week of events.

    GPU time (every outcome) over the tokens of succeeded rows, rounded up: failed and
    aborted work raises the figure, which errs towards holding more. None until the
    revision has `MEASURED_COST_MIN_TOKENS` of history.
    """
    totals = UsageRollup.objects.filter(
        revision_id=revision_id, bucket__gte=clock.now() - MEASURED_COST_WINDOW
    ).aggregate(gpu=Sum("gpu_microseconds"), input=Sum("input_tokens"), output=Sum("output_tokens"))
    tokens = int(totals["input"] or 0) + int(totals["output"] or 0)
    if tokens < MEASURED_COST_MIN_TOKENS:
        return None
    return max(1, -(-int(totals["gpu"] or 0) // tokens))
