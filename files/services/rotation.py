"""Master key rotation: data keys re-wrapped under the keyring's current master key.

`data_keys_rewrap` is what `manage.py rotate_master_key` runs over every table holding
wrapped data keys (docs/ARCHITECTURE.md decision 6); the content is never re-encrypted, since
the data keys themselves stay the same.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from django.db.models import QuerySet

from files.crypto import Keyring, TamperedContent, UnknownMasterKey


@dataclass
class RewrapCounts:
    rewrapped: int = 0  # wrapped again under the current master key by this call
    current: int = 0  # already under the current master key
    unknown_key: int = 0  # wrapped by a master key that is not configured: left as it is
    damaged: int = 0  # failed authentication under its master key: left as it is

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


REWRAP_PAGE = 500


def data_keys_rewrap(
    *, rows: QuerySet[Any], keyring: Keyring, dry_run: bool = False
) -> RewrapCounts:
    """Re-wrap the data keys of `rows` (a model with key_id and wrapped_key) under the
    keyring's current master key. Content is untouched: the data keys stay the same.

    Each row is a compare-and-set on its old key id with the key still present, so a
    concurrent delete is never undone and concurrent or repeated runs re-wrap each row once.
    """
    counts = RewrapCounts()
    live = rows.filter(wrapped_key__isnull=False)
    counts.current = live.filter(key_id=keyring.current_id).count()
    stale = live.exclude(key_id=keyring.current_id).order_by("pk")
    last_pk: Any = None
    while True:
        page = stale if last_pk is None else stale.filter(pk__gt=last_pk)
        batch = list(page.only("pk", "key_id", "wrapped_key")[:REWRAP_PAGE])
        if not batch:
            return counts
        last_pk = batch[-1].pk
        for row in batch:
            try:
                data_key = keyring.unwrap(row.key_id, row.wrapped_key)
            except UnknownMasterKey:
                counts.unknown_key += 1
                continue
            except TamperedContent:
                counts.damaged += 1
                continue
            if dry_run:
                counts.rewrapped += 1
                continue
            key_id, wrapped = keyring.wrap(data_key)
            counts.rewrapped += (
                type(row)
                .objects.filter(pk=row.pk, key_id=row.key_id, wrapped_key__isnull=False)
                .update(key_id=key_id, wrapped_key=wrapped)
            )
