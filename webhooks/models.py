"""Webhook endpoints, the event outbox, deliveries and their attempts (docs/API.md "Webhooks").

An event row is written in the same transaction that makes a batch terminal, with one
delivery row per subscribed endpoint: the outbox. Deliveries are driven by an actor and
re-driven by the sweep until an endpoint answers 2xx or 24 hours pass. Rows hold ids,
statuses and timings — never content.
"""

from __future__ import annotations

import datetime as dt

from django.db import models

from boardwalk import clock
from boardwalk.models import Organization

EVENT_TYPES = ("batch.completed", "batch.failed", "batch.expired", "batch.cancelled")


class WebhookEndpoint(models.Model):
    id = models.CharField(primary_key=True, max_length=40)
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=128)
    url = models.CharField(max_length=2048)
    event_types = models.JSONField(default=list)
    # The signing secret is needed in clear to sign, so it is kept wrapped by the master
    # key (files.crypto.Keyring), like a file's data key; it is shown only at creation and
    # rotation. The hint is a few characters of it, enough to tell two secrets apart.
    secret_key_id = models.CharField(max_length=64)
    wrapped_secret = models.BinaryField()
    secret_hint = models.CharField(max_length=32, blank=True)
    # After a rotation that keeps the old secret for 24 hours, deliveries carry a signature
    # with each secret until `previous_secret_expires_at`, so receivers can switch over.
    previous_secret_key_id = models.CharField(max_length=64, blank=True)
    previous_wrapped_secret = models.BinaryField(null=True, blank=True)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=clock.now, editable=False)
    # The last change of name, url, event types or secret (a test or an unchanged update
    # leaves it).
    updated_at = models.DateTimeField(default=clock.now)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.id} {self.name}"

    def keeps_previous_secret(self, at: dt.datetime) -> bool:
        return (
            self.previous_wrapped_secret is not None
            and self.previous_secret_expires_at is not None
            and at < self.previous_secret_expires_at
        )


class WebhookEvent(models.Model):
    id = models.CharField(primary_key=True, max_length=40)
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    type = models.CharField(max_length=32)
    # One terminal event per batch, whatever retries the finalization went through.
    batch_id = models.CharField(max_length=40, unique=True)
    created_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.id} {self.type}"


class WebhookDelivery(models.Model):
    class State(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # gave up after 24 hours

    event = models.ForeignKey(WebhookEvent, on_delete=models.CASCADE, related_name="deliveries")
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # When the next attempt may start; a running attempt pushes it ahead as its claim.
    next_attempt_at = models.DateTimeField(default=clock.now)
    last_status = models.PositiveIntegerField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(fields=["event", "endpoint"], name="webhook_delivery_once"),
        ]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="webhook_due")]

    def __str__(self) -> str:
        return f"{self.event_id} → {self.endpoint_id} ({self.state})"


class WebhookAttempt(models.Model):
    delivery = models.ForeignKey(
        WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log"
    )
    number = models.PositiveIntegerField()
    attempted_at = models.DateTimeField(default=clock.now)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField(default=0)
    # A short reason code when no HTTP answer came back (refused, timeout, connect, …).
    error = models.CharField(max_length=32, blank=True)

    class Meta:
        ordering = ["delivery_id", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}"
