"""Usage as integer events, written once with the result they belong to (docs/ARCHITECTURE.md
decision 10)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import IntegrityError, transaction
from django.db.models import Sum

from batches.models import Batch, BatchItem
from batches.queue import EngineKey, item_release, items_claim, leases_recover
from billing.metering import UsageFacts, usage_record
from billing.models import UsageEvent, UsageRollup
from billing.pricing import TokenPrices, money_div, token_charge
from billing.selectors import MEASURED_COST_MIN_TOKENS, revision_gpu_microseconds_per_token
from boardwalk import clock
from tests.batches.conftest import finalize, rows, run_worker, submit
from tests.conftest import GPU_SECOND_PRICE, Api

pytestmark = pytest.mark.django_db


def _sum(**filters: object) -> int:
    return int(UsageEvent.objects.filter(**filters).aggregate(s=Sum("quantity"))["s"] or 0)


def test_money_rounds_half_up_everywhere():
    assert [money_div(n, 10) for n in (4, 5, 14, 15)] == [0, 1, 1, 2]
    prices = TokenPrices(input=1, cached_input=0, output=0)
    assert token_charge(prices, prompt=500_000, cached=0, completion=0) == 1  # 0.5 → 1
    assert token_charge(prices, prompt=499_999, cached=0, completion=0) == 0


def test_each_recorded_item_leaves_integer_events_equal_to_its_usage(api: Api, catalog_model):
    data = submit(api, rows(3))
    run_worker(data["id"])
    finalize(data["id"])
    items = list(BatchItem.objects.filter(batch_id=data["id"]))
    for item in items:
        assert _sum(item_id=item.id, kind="input_tokens") == item.usage_prompt_tokens > 0
        assert _sum(item_id=item.id, kind="output_tokens") == item.usage_completion_tokens > 0
        assert _sum(item_id=item.id, kind="cached_tokens") == item.usage_cached_tokens
        assert _sum(item_id=item.id, kind="gpu_microseconds") > 0
    rollup = UsageRollup.objects.get()
    assert rollup.input_tokens == _sum(kind="input_tokens")
    assert rollup.gpu_microseconds == _sum(kind="gpu_microseconds")
    assert rollup.items_succeeded == 3
    assert rollup.spend_microusd == Batch.objects.get(id=data["id"]).charge_microusd


def test_the_same_attempt_can_never_be_metered_twice(api: Api, catalog_model):
    data = submit(api, rows(1))
    item = BatchItem.objects.get(batch_id=data["id"])
    facts = UsageFacts(
        org_id=item.org_id_key,
        batch_id=item.batch_id,
        item_id=item.id,
        attempt=1,
        revision_id=item.revision_id_key,
        deployment_id="",
        outcome="succeeded",
        prompt_tokens=5,
        completion_tokens=2,
        gpu_microseconds=10,
    )
    usage_record(facts=[facts])
    with pytest.raises(IntegrityError), transaction.atomic():
        usage_record(facts=[facts])
    assert _sum(item_id=item.id) == 17
    assert UsageRollup.objects.get().input_tokens == 5  # the failed repeat rolled back


def test_aborted_work_is_metered_under_its_fence_and_only_once(api: Api, deployment):
    data = submit(api, rows(1, model=deployment.name))
    batch = Batch.objects.get(id=data["id"])
    key = EngineKey(batch.revision_id, deployment.id)
    item = items_claim(key=key, worker_id="w", limit=1)[0]
    assert item_release(item=item, worker_id="w", gpu_seconds=1.25)
    assert not item_release(item=item, worker_id="w", gpu_seconds=1.25)  # a repeat: fenced
    stale = items_claim(key=key, worker_id="w2", limit=1)[0]
    with clock.travel(dt.timedelta(hours=1)):
        leases_recover()  # w2 is presumed dead: its lease is re-issued
    assert not item_release(item=stale, worker_id="w2", gpu_seconds=9.0)
    assert _sum(item_id=item.id, kind="gpu_microseconds") == 1_250_000
    assert UsageEvent.objects.get(item_id=item.id).attempt == item.lease_token
    assert UsageRollup.objects.get().items_failed == 0  # handed back, not ended


def test_deployment_holds_use_the_revisions_measured_cost_once_it_has_history(
    api: Api, deployment, settings
):
    revision_id = deployment.revision_id
    assert revision_gpu_microseconds_per_token(revision_id=revision_id) is None
    fallback = submit(api, rows(2, model=deployment.name), key="before")
    tokens = sum(i.prompt_tokens + i.max_tokens * i.n for i in fallback_items(fallback["id"]))
    per_token = settings.GPU_MICROSECONDS_PER_TOKEN_ESTIMATE
    expected = money_div(tokens * per_token * GPU_SECOND_PRICE, 1_000_000)
    assert Batch.objects.get(id=fallback["id"]).hold_microusd == expected
    item = BatchItem.objects.filter(batch_id=fallback["id"]).first()
    usage_record(
        facts=[
            UsageFacts(
                org_id=item.org_id_key,
                batch_id=item.batch_id,
                item_id=item.id,
                attempt=99,
                revision_id=revision_id,
                deployment_id=deployment.id,
                outcome="succeeded",
                prompt_tokens=MEASURED_COST_MIN_TOKENS,
                completion_tokens=0,
                gpu_microseconds=MEASURED_COST_MIN_TOKENS * 30,
            )
        ]
    )
    assert revision_gpu_microseconds_per_token(revision_id=revision_id) == 30
    measured = submit(api, rows(2, model=deployment.name), key="after")
    tokens = sum(i.prompt_tokens + i.max_tokens * i.n for i in fallback_items(measured["id"]))
    hold = Batch.objects.get(id=measured["id"]).hold_microusd
    assert hold == money_div(tokens * 30 * GPU_SECOND_PRICE, 1_000_000)


def fallback_items(batch_id: str) -> list[BatchItem]:
    return list(BatchItem.objects.filter(batch_id=batch_id))
