"""The durable work queue: batch items in the database, claimed under a lease.

    enqueue ─► claim (lease, heartbeat) ─► finish (fenced write, meter) ─► finalization
                  ▲                          │ release
                  └── recover (expired leases, dead workers, stopping batches) ◄┘

- `enqueue.py`: a new batch's items, in one statement run.
- `claim.py`: a group of items leased fairly between organizations, earliest deadline first,
  attempts bounded; the heartbeat that extends what a run holds.
- `finish.py`: results written under each row's fencing token, leases handed back, a stopped
  batch's unrun items ended, charges set; `items_meter`, the one place usage is metered.
- `recover.py`: leases taken back when they expire, their worker died or their batch stops.
- `queries.py`: what the queue holds (claimable work per engine key, open items, live leases).
"""

from batches.queue.claim import (
    ClaimGroup,
    LeaseHeartbeat,
    LeaseHolder,
    items_claim,
    items_claim_group,
    items_heartbeat,
)
from batches.queue.enqueue import items_insert
from batches.queue.finish import (
    ItemOutcome,
    batch_end_open_items,
    item_finish,
    item_release,
    items_meter,
    items_record,
    items_set_charges,
)
from batches.queue.queries import (
    EngineKey,
    batch_has_open_items,
    batch_live_leases,
    batches_without_open_items,
    key_has_claimable_items,
    keys_with_claimable_items,
)
from batches.queue.recover import batch_revoke_leases, dead_workers_recover, leases_recover

__all__ = [
    "ClaimGroup",
    "EngineKey",
    "ItemOutcome",
    "LeaseHeartbeat",
    "LeaseHolder",
    "batch_end_open_items",
    "batch_has_open_items",
    "batch_live_leases",
    "batch_revoke_leases",
    "batches_without_open_items",
    "dead_workers_recover",
    "item_finish",
    "item_release",
    "items_claim",
    "items_claim_group",
    "items_heartbeat",
    "items_insert",
    "items_meter",
    "items_record",
    "items_set_charges",
    "key_has_claimable_items",
    "keys_with_claimable_items",
    "leases_recover",
]
