"""Stored files: input uploads and published result files. Content lives encrypted in the
content store; this row holds only metadata and the wrapped data key."""

from __future__ import annotations

import builtins

from django.db import models

from boardwalk import clock
from boardwalk.ids import new_id
from boardwalk.models import Organization


def _file_id() -> str:
    return new_id("file-")


class File(models.Model):
    class Purpose(models.TextChoices):
        BATCH = "batch"
        BATCH_OUTPUT = "batch_output"

    class Status(models.TextChoices):
        UPLOADED = "uploaded"
        PROCESSED = "processed"
        DELETED = "deleted"

    id = models.CharField(primary_key=True, max_length=40, default=_file_id, editable=False)
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="files")
    purpose = models.CharField(max_length=20, choices=Purpose.choices)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PROCESSED)
    filename = models.CharField(max_length=200)
    bytes = models.BigIntegerField(help_text="Plaintext size.")
    sha256 = models.CharField(
        max_length=64, help_text="SHA-256 over the GCM chunk tags, in order: the strong ETag."
    )
    storage_name = models.CharField(max_length=300)
    # Result files only: a second, byte-identical blob under another prefix, read when the
    # primary is missing or fails authentication. Empty for input files.
    recovery_name = models.CharField(max_length=300, blank=True, default="")
    stored_bytes = models.BigIntegerField(default=0)
    key_id = models.CharField(max_length=64, blank=True)
    # Null once deleted: destroying the data key makes every stored copy unreadable.
    wrapped_key = models.BinaryField(null=True, editable=False)
    # Input files only: the common body.model and, per line, offset/length/custom_id/
    # max_tokens/n. Ids and counts only, never content.
    model = models.CharField(max_length=200, blank=True)
    # "" for the standard format; "sectioned.v1" for BatchRouter sectioned JSONL, whose
    # line_index rows also carry the offset and length of each request's section line.
    format = models.CharField(max_length=20, blank=True, default="")
    line_count = models.PositiveIntegerField(default=0)
    line_index = models.JSONField(null=True, editable=False)
    # Input files only: each line_index row's prompt tokens, counted by a worker right after
    # the upload (files.counting) with the tokenizer of `prompt_tokens_revision`, the model's
    # serving revision then. Acceptance uses them when it pins that same revision and counts
    # again otherwise. Null / "": not counted (yet, or the count failed).
    prompt_tokens = models.JSONField(null=True, editable=False)
    prompt_tokens_revision = models.CharField(max_length=40, blank=True, default="")
    created_at = models.DateTimeField(default=clock.now, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["org", "purpose", "status"]),
            models.Index(fields=["status", "expires_at"]),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def etag(self) -> str:
        return f'"{self.sha256}"'

    @property
    def is_readable(self) -> bool:
        return self.status == self.Status.PROCESSED and self.wrapped_key is not None

    def aad(self) -> builtins.bytes:
        return self.id.encode()
