from __future__ import annotations

from typing import Any

from inference.selectors import ResolvedModel


def model_payload(entry: ResolvedModel) -> dict[str, Any]:
    batch: dict[str, Any] | None = None
    if entry.catalog is not None and entry.batch_enabled:
        batch = {
            "unit": "microusd_per_million_tokens",
            "input": str(entry.catalog.price_input),
            "cached_input": str(entry.catalog.price_cached_input),
            "output": str(entry.catalog.price_output),
            # What batch accepts: the entry's media as far as its revision publishes and the
            # engine runs them.
            "media": sorted(entry.batch_media),
        }
    return {
        "id": entry.name,
        "object": "model",
        "created": int(entry.revision.created_at.timestamp()),
        "owned_by": "boardwalk" if entry.kind == "catalog" else entry.deployment.org_id,  # type: ignore[union-attr]
        "kind": entry.kind,
        "model_config_id": entry.revision.id,
        "modalities": list(entry.revision.modalities),
        "context_length": entry.revision.context_length,
        "batch": batch,
    }
