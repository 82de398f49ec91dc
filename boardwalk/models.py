from __future__ import annotations

from django.db import models

from boardwalk import clock
from boardwalk.ids import new_id

SCOPE_WRITE = "inference:write"
SCOPE_READ = "requests:read"
ALL_SCOPES = (SCOPE_WRITE, SCOPE_READ)


def _org_id() -> str:
    return new_id("org_")


class Organization(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=_org_id, editable=False)
    name = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"


class ApiKey(models.Model):
    """An organization's key. Only the prefix and a peppered hash are stored."""

    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200, blank=True)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(default=clock.now, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"bw_{self.prefix}_… ({self.org.name})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class MetricCounter(models.Model):
    """A monotonic counter of `boardwalk.metrics`, shared by every process through the database.

    `labels` is the canonical `k="v",…` text of the label set (never tenant ids or content).
    """

    name = models.CharField(max_length=100)
    labels = models.CharField(max_length=200, blank=True, default="")
    value = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "labels"], name="metric_counter_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.name}{{{self.labels}}} {self.value}"
