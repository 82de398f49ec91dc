"""Credit as an append-only ledger (docs/BILLING.md). Balances are derived, never stored."""

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
        # An interactive request answered with an error after a worker had charged it: the
        # charge given back (+balance), never deleted (billing.services.credit_void).
        REFUND = "refund"

    org = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="ledger")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    amount_microusd = models.BigIntegerField(help_text="Always >= 0; the kind gives the sign.")
    # What the entry is about: a batch (batch_…), or an interactive request (req_…) in
    # request_id; a grant names neither.
    batch_id = models.CharField(max_length=40, blank=True, db_index=True)
    request_id = models.CharField(max_length=40, blank=True, db_index=True)
    # One entry per (purpose, batch or request): a retried finalization, acceptance or settle
    # is a no-op (`hold:batch_…`, `charge:req_…`).
    idempotency_key = models.CharField(max_length=120, unique=True)
    memo = models.CharField(max_length=200, blank=True, help_text="Ids and reasons; never content.")
    created_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "ledger entries"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(amount_microusd__gte=0), name="ledger_amount_non_negative"
            ),
            models.CheckConstraint(
                condition=models.Q(batch_id="") | models.Q(request_id=""),
                name="ledger_one_subject",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount_microusd} µUSD ({self.org_id})"


class UsageEvent(models.Model):
    """One integer usage fact of one item attempt (docs/ARCHITECTURE.md decision 10). Append-only.

    Written in the transaction that records the item's result (or hands an aborted item
    back) under its fencing token, so a fenced-off or retried write never counts: the
    unique (item, attempt, kind) makes a second count an error, not a silent double. Ids
    are plain strings: billing sits below batches and inference and imports neither.
    """

    class Kind(models.TextChoices):
        INPUT_TOKENS = "input_tokens"  # every prompt token, cached ones included
        CACHED_TOKENS = "cached_tokens"  # the part of input_tokens found in the prefix cache
        OUTPUT_TOKENS = "output_tokens"
        # The part of output_tokens the model spent reasoning (charged as output, no more)
        REASONING_TOKENS = "reasoning_tokens"
        GPU_MICROSECONDS = "gpu_microseconds"  # engine busy time (its share of each step)

    org = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="+")
    # Whose usage: a batch's item (batch_id), or an interactive request (request_id, req_…),
    # exactly one of the two.
    batch_id = models.CharField(max_length=40, blank=True, db_index=True)
    request_id = models.CharField(max_length=40, blank=True, db_index=True)
    item_id = models.BigIntegerField()
    attempt = models.PositiveBigIntegerField(help_text="The item's lease token when written.")
    revision_id = models.CharField(max_length=40)
    deployment_id = models.CharField(max_length=40, blank=True)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    quantity = models.BigIntegerField()
    # "batch", or "interactive": then request_id names the request and item_id is a negative
    # number derived from it (batches.interactive.settle), never a BatchItem's id.
    usage_class = models.CharField(max_length=12, default="batch")
    created_at = models.DateTimeField(default=clock.now, editable=False, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["item_id", "attempt", "kind"], name="usage_event_once"),
            models.CheckConstraint(
                condition=models.Q(quantity__gt=0), name="usage_event_quantity_positive"
            ),
            models.CheckConstraint(
                condition=(models.Q(batch_id="") & ~models.Q(request_id=""))
                | (~models.Q(batch_id="") & models.Q(request_id="")),
                name="usage_event_one_subject",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.quantity} ({self.batch_id or self.request_id}#{self.item_id})"


class UsageRollup(models.Model):
    """Hourly sums of the usage events and of settled spend, per org, revision, deployment.

    Maintained in the same transactions as the events and the ledger's charge entries (one
    upsert per key), so the dashboard reads a few thousand rows instead of millions of
    events, and its spend is the ledger's charges to the micro-dollar.
    """

    bucket = models.DateTimeField(help_text="Start of the UTC hour.")
    org = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="+")
    revision_id = models.CharField(max_length=40)
    deployment_id = models.CharField(max_length=40, blank=True)
    usage_class = models.CharField(max_length=12, default="batch")  # "batch" | "interactive"
    input_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)  # the part of output_tokens reasoning
    gpu_microseconds = models.BigIntegerField(default=0)
    items_succeeded = models.BigIntegerField(default=0)
    items_failed = models.BigIntegerField(default=0)
    spend_microusd = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["bucket", "org", "revision_id", "deployment_id", "usage_class"],
                name="usage_rollup_class_key",
            ),
        ]
        indexes = [models.Index(fields=["revision_id", "bucket"], name="usage_rollup_revision")]

    def __str__(self) -> str:
        return f"{self.bucket:%Y-%m-%d %H}h {self.org_id} {self.revision_id}"
