"""Reads of files, always scoped to the organization: another org's id is "not found"."""

from __future__ import annotations

from django.db.models import Sum

from boardwalk import clock
from boardwalk.errors import NotFound
from boardwalk.models import Organization
from files.models import File


def file_get_for_org(*, org: Organization, file_id: str) -> File:
    file = File.objects.filter(org=org, id=file_id).first()
    if file is None:
        raise NotFound(f"No file with id {file_id!r}.", param="file_id")
    return file


def file_readable_for_org(*, org: Organization, file_id: str) -> File:
    """A file whose content can be served: not deleted, not expired."""
    file = file_get_for_org(org=org, file_id=file_id)
    if not file.is_readable or (file.expires_at is not None and file.expires_at <= clock.now()):
        raise NotFound(
            f"File {file_id!r} has no content: it was deleted or has expired.", param="file_id"
        )
    return file


def retained_input_bytes(*, org: Organization) -> int:
    """Bytes of the org's input files still held in storage
    (docs/API.md "Limits, retention and privacy": 1 GiB per org)."""
    total = File.objects.filter(
        org=org, purpose=File.Purpose.BATCH, status=File.Status.PROCESSED
    ).aggregate(total=Sum("bytes"))["total"]
    return int(total or 0)
