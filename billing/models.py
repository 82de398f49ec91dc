"""Credit as an append-only ledger (SPEC §8). Balances are derived, never stored."""

from __future__ import annotations

from django.db import models

from boardwalk import clock
from boardwalk.models import Organization


class LedgerEntry(models.Model):
    class Kind(models.TextChoices):
        GRANT = "grant"  # staff adds credit (+balance)
        HOLD = "hold"  # acceptance reserves the maximum cost (-available)
        RELEASE = "release"  # finalization returns the hold (+available)
        CHARGE = "charge"  # finalization bills what was published (-balance)

    org = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="ledger")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    amount_microusd = models.BigIntegerField(help_text="Always >= 0; the kind gives the sign.")
    batch_id = models.CharField(max_length=40, blank=True, db_index=True)
    # One entry per (purpose, batch): a retried finalization or acceptance is a no-op.
    idempotency_key = models.CharField(max_length=120, unique=True)
    memo = models.CharField(max_length=200, blank=True, help_text="Ids and reasons; never content.")
    created_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "ledger entries"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(amount_microusd__gte=0), name="ledger_amount_non_negative"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount_microusd} µUSD ({self.org_id})"
