"""Durable claims (docs/ARCHITECTURE.md decision 2): concurrent workers never lease the same
item."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from batches.models import Batch, BatchItem
from batches.queue import EngineKey, items_claim
from tests.batches.conftest import rows, submit
from tests.conftest import Api, postgres_only


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_are_disjoint_with_skip_locked(api: Api, catalog_model):
    data = submit(api, rows(40, max_tokens=1))
    key = EngineKey(Batch.objects.get(id=data["id"]).revision_id)
    claimed: dict[str, list[int]] = {"a": [], "b": [], "c": []}

    def claim_all(name: str) -> None:
        try:
            while items := items_claim(key=key, worker_id=name, limit=3):
                claimed[name].extend(item.id for item in items)
        finally:
            connection.close()

    threads = [threading.Thread(target=claim_all, args=(name,)) for name in claimed]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [item for ids in claimed.values() for item in ids]
    assert len(every) == len(set(every)) == 40
    assert (
        BatchItem.objects.filter(batch_id=data["id"], state="running", lease_token=1).count() == 40
    )


@pytest.mark.django_db
def test_claims_follow_earliest_deadline_first(api: Api, catalog_model):
    import datetime as dt

    from boardwalk import clock

    late = submit(api, rows(2), key="late")
    early = submit(api, rows(2), key="early")
    Batch.objects.filter(id=early["id"]).update(expires_at=clock.now() + dt.timedelta(hours=1))
    BatchItem.objects.filter(batch_id=early["id"]).update(
        deadline=clock.now() + dt.timedelta(hours=1)
    )
    key = EngineKey(Batch.objects.get(id=late["id"]).revision_id)
    first = items_claim(key=key, worker_id="w", limit=2)
    assert {item.batch_id for item in first} == {early["id"]}


@pytest.mark.django_db
def test_accepted_items_carry_their_own_values_shared_ones_and_defaults(api: Api, catalog_model):
    """items_insert writes each row's own values, the batch's shared ones, the plain defaults,
    and calls a callable default (the ids) once per row."""
    created = submit(api, rows(5))
    batch = Batch.objects.get(id=created["id"])
    items = list(BatchItem.objects.filter(batch=batch).order_by("index"))
    assert [i.index for i in items] == list(range(5))
    assert [i.custom_id for i in items] == [f"task-{i}" for i in range(5)]
    offsets = [i.line_offset for i in items]
    assert offsets == sorted(offsets) and len(set(offsets)) == 5
    assert all(i.line_length > 0 and i.prompt_tokens > 0 for i in items)
    assert {i.section_offset for i in items} == {None}
    assert {(i.revision_id_key, i.org_id_key, i.deadline) for i in items} == {
        (batch.revision_id, batch.org_id, batch.expires_at)
    }
    assert {(i.state, i.attempts, i.lease_token, i.published) for i in items} == {
        (BatchItem.State.PENDING, 0, 0, False)
    }
    assert len({i.request_id for i in items}) == 5 and len({i.row_id for i in items}) == 5
    # Fields without a default take their empty value (written once for every row).
    assert {
        (i.lease_owner, i.lease_expires_at, i.result, i.error_code, i.started_at, i.completed_at)
        for i in items
    } == {("", None, None, "", None, None)}


@pytest.mark.django_db
def test_a_group_write_fences_each_row_on_its_own(api: Api, catalog_model):
    """One group, three leases: current, re-claimed by another worker since (stale token),
    and past its expiry. Only the current one is written; the others are untouched."""
    import datetime as dt

    from batches.queue import ItemOutcome, items_record
    from boardwalk import clock

    data = submit(api, rows(3, max_tokens=1))
    key = EngineKey(Batch.objects.get(id=data["id"]).revision_id)
    current, stale, expired = sorted(items_claim(key=key, worker_id="w", limit=3), key=_index)
    BatchItem.objects.filter(id=stale.id).update(lease_token=stale.lease_token + 1)
    BatchItem.objects.filter(id=expired.id).update(
        lease_expires_at=clock.now() - dt.timedelta(seconds=1)
    )
    outcomes = [
        ItemOutcome(item, succeeded=True, result=b"sealed", prompt_tokens=5, completion_tokens=1)
        for item in (current, stale, expired)
    ]
    recorded: list[ItemOutcome] = []
    written = items_record(outcomes=outcomes, worker_id="w", in_transaction=recorded.extend)
    assert written == [True, False, False]
    assert [o.item.id for o in recorded] == [current.id]
    after = {i.id: i for i in BatchItem.objects.filter(batch_id=data["id"])}
    assert after[current.id].state == "succeeded"
    assert bytes(after[current.id].result) == b"sealed"
    assert after[current.id].usage_prompt_tokens == 5
    assert after[current.id].lease_owner == "" and after[current.id].completed_at is not None
    for item in (stale, expired):
        assert after[item.id].state == "running" and after[item.id].result is None
        assert after[item.id].lease_owner == "w" and after[item.id].usage_prompt_tokens == 0


def _index(item: BatchItem) -> int:
    return item.index
