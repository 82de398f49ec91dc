"""Batches, their items and idempotency records. Rows hold ids, offsets and counts; item
results are stored encrypted under the batch's own data key."""

from __future__ import annotations

import datetime as dt

from django.db import models
from django.db.models import Q

from boardwalk import clock
from boardwalk.ids import new_id
from boardwalk.models import Organization
from files.models import File
from inference.models import Deployment, ModelRevision


def _batch_id() -> str:
    return new_id("batch_")


def _request_id() -> str:
    return new_id("req_")


def _row_id() -> str:
    return new_id("batch_req_")


def _running(prefix: str = "") -> Q:
    """A batch still running: in progress, and no stop (cancel, expiry, failure) chosen yet.
    `prefix` reaches it through a relation (`batch__`)."""
    return Q(**{f"{prefix}status": Batch.Status.IN_PROGRESS, f"{prefix}outcome": ""})


class BatchQuerySet(models.QuerySet["Batch"]):
    def running(self) -> BatchQuerySet:
        """Batches whose items still run: the only ones a claim takes work from."""
        return self.filter(_running())

    def overdue(self) -> BatchQuerySet:
        """Running batches past their expiry: the sweep expires them."""
        return self.running().filter(expires_at__lte=clock.now())

    def stopping(self) -> BatchQuerySet:
        """Batches whose running items must stop: no longer running, or past expiry."""
        return self.exclude(_running(), expires_at__gt=clock.now())


class Batch(models.Model):
    class Status(models.TextChoices):
        IN_PROGRESS = "in_progress"
        FINALIZING = "finalizing"
        CANCELLING = "cancelling"
        COMPLETED = "completed"
        CANCELLED = "cancelled"
        FAILED = "failed"
        EXPIRED = "expired"

    TERMINAL = (Status.COMPLETED, Status.CANCELLED, Status.FAILED, Status.EXPIRED)
    UNFINISHED = (Status.IN_PROGRESS, Status.FINALIZING, Status.CANCELLING)

    class Billing(models.TextChoices):
        CATALOG = "catalog"
        GPU_TIME = "gpu_time"

    id = models.CharField(primary_key=True, max_length=40, default=_batch_id, editable=False)
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="batches")
    # One batch per input file (docs/API.md "Batches"); the DB enforces it.
    input_file = models.OneToOneField(File, on_delete=models.PROTECT, related_name="batch")
    endpoint = models.CharField(max_length=60, default="/v1/chat/completions")
    completion_window = models.CharField(max_length=10, default="24h")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.IN_PROGRESS)
    model_name = models.CharField(max_length=200)
    revision = models.ForeignKey(ModelRevision, on_delete=models.PROTECT, related_name="+")
    deployment = models.ForeignKey(
        Deployment, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    billing = models.CharField(max_length=10, choices=Billing.choices)
    price_input = models.BigIntegerField(null=True, blank=True)
    price_cached_input = models.BigIntegerField(null=True, blank=True)
    price_output = models.BigIntegerField(null=True, blank=True)
    gpu_second_price = models.BigIntegerField(null=True, blank=True)
    metadata = models.JSONField(null=True, blank=True)

    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)

    hold_microusd = models.BigIntegerField(default=0)
    charge_microusd = models.BigIntegerField(null=True, blank=True)
    usage = models.JSONField(null=True, blank=True)
    errors = models.JSONField(null=True, blank=True)

    output_file = models.ForeignKey(
        File, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    error_file = models.ForeignKey(
        File, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Terminal state chosen when finalization began (completed/cancelled/expired/failed).
    outcome = models.CharField(max_length=20, blank=True)

    key_id = models.CharField(max_length=64)
    wrapped_key = models.BinaryField(null=True, editable=False)

    created_at = models.DateTimeField(default=clock.now, editable=False)
    expires_at = models.DateTimeField()
    finalizing_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)

    objects = BatchQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "batches"
        indexes = [
            models.Index(fields=["org", "-created_at", "-id"]),
            models.Index(fields=["status", "expires_at"]),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    def aad(self) -> bytes:
        return self.id.encode()


class BatchItemQuerySet(models.QuerySet["BatchItem"]):
    def open(self) -> BatchItemQuerySet:
        """Items that may still run: pending or running."""
        return self.filter(state__in=BatchItem.OPEN)

    def live(self) -> BatchItemQuerySet:
        """Open items of batches still running: the work the queue really holds.

        A stopping batch's open items (cancel, expiry, failure) never run again and end
        `failed` when it is published; every count of queued work (capacity, metrics, the
        dashboard, the sweeper) reads this, never the bare item states.
        """
        return self.open().filter(_running("batch__"))

    def running(self) -> BatchItemQuerySet:
        """Items under a lease (live or expired)."""
        return self.filter(state=BatchItem.State.RUNNING)

    def claimable(self, now: dt.datetime) -> BatchItemQuerySet:
        """Pending items of running batches within their deadline: what a claim may lease.
        The claim's own SQL (batches.queue.claim) spells the same conditions."""
        return self.filter(_running("batch__"), state=BatchItem.State.PENDING, deadline__gt=now)


class BatchItem(models.Model):
    """One input line. Claimed with a lease; its result is written under a fencing token."""

    class State(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    OPEN = (State.PENDING, State.RUNNING)
    DONE = (State.SUCCEEDED, State.FAILED)

    # Indexes are few on purpose: a result write changes `state`, so it is never a HOT
    # update and every index of the table takes a new entry per row written. A batch's items
    # are found through `item_unique_index` (batch, index), the claim through
    # `item_claim_idx`; neither the foreign key nor `revision_id_key` needs its own.
    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="items", db_index=False)
    index = models.PositiveIntegerField()
    custom_id = models.CharField(max_length=200)
    line_offset = models.BigIntegerField()
    line_length = models.BigIntegerField()
    # Sectioned input (docs/API.md "BatchRouter sectioned input"): the section line whose body and
    # prefix the request extends. Stored once in the file, referenced by every item of the section.
    section_offset = models.BigIntegerField(null=True, blank=True)
    section_length = models.BigIntegerField(default=0)
    max_tokens = models.PositiveIntegerField()
    n = models.PositiveSmallIntegerField(default=1)
    prompt_tokens = models.PositiveIntegerField(default=0)

    # Denormalized from the batch so the claim query needs no join.
    revision_id_key = models.CharField(max_length=40)
    deployment_id_key = models.CharField(max_length=40, blank=True)
    org_id_key = models.CharField(max_length=40)
    deadline = models.DateTimeField()

    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    lease_owner = models.CharField(max_length=100, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_token = models.PositiveBigIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0)

    request_id = models.CharField(max_length=40, unique=True, default=_request_id)
    row_id = models.CharField(max_length=40, unique=True, default=_row_id)
    result = models.BinaryField(null=True, editable=False)  # encrypted result row JSON
    error_code = models.CharField(max_length=60, blank=True)
    usage_prompt_tokens = models.PositiveIntegerField(default=0)
    usage_cached_tokens = models.PositiveIntegerField(default=0)
    usage_completion_tokens = models.PositiveIntegerField(default=0)
    # The part of usage_completion_tokens the model spent reasoning (charged as output).
    usage_reasoning_tokens = models.PositiveIntegerField(default=0)
    # Set at finalization for rows durably published in the output file.
    published = models.BooleanField(default=False)
    charge_microusd = models.BigIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    objects = BatchItemQuerySet.as_manager()

    class Meta:
        ordering = ["batch", "index"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "index"], name="item_unique_index"),
        ]
        indexes = [
            models.Index(fields=["revision_id_key", "state", "deadline"], name="item_claim_idx"),
            models.Index(fields=["state", "lease_expires_at"], name="item_lease_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.batch_id}#{self.index}"

    @property
    def span(self) -> tuple[int, int, int | None, int]:
        """Where the item's line (and its section line, if any) lie in the input file."""
        return self.line_offset, self.line_length, self.section_offset, self.section_length


class IdempotencyRecord(models.Model):
    """An Idempotency-Key of POST /v1/batches, scoped to the organization."""

    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=256)
    request_hash = models.CharField(max_length=64)
    batch = models.ForeignKey(
        Batch, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    created_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org", "key"], name="idempotency_unique_key"),
        ]

    def __str__(self) -> str:
        return f"{self.org_id}:{self.key}"


class WorkerProcess(models.Model):
    """A live worker process: it stamps `seen_at` every few seconds (batches.liveness).

    Item leases name their process (`lease_owner` starts with this id), so when a process
    falls silent the others free its leases at once instead of waiting for them to expire.
    """

    id = models.CharField(primary_key=True, max_length=100)
    started_at = models.DateTimeField(default=clock.now, editable=False)
    seen_at = models.DateTimeField(default=clock.now, db_index=True)
    # Stamped with each beat, for the staff console's workers view (ids and counts only).
    revisions = models.JSONField(default=list, blank=True, help_text="Revisions with an engine.")
    device = models.CharField(
        max_length=32, blank=True, help_text="Where its engines run (run_worker --device)."
    )
    items_recorded = models.BigIntegerField(default=0, help_text="Results written since start.")
    items_per_second = models.FloatField(default=0.0, help_text="Over the last minute.")
    # PostgreSQL: the process holds a session advisory lock on its id for as long as its
    # liveness connection lives, so its death is seen the moment that lock is free.
    session_lock = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.id
