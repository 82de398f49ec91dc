"""Reasoning tokens (issue 39): the part of a reply's completion tokens the model spent
reasoning is counted in `completion_tokens_details.reasoning_tokens` of the row's body, of the
item, of the batch's usage and of its receipt, and metered as a detail of the output tokens:
charged as output, never on top of it (docs/API.md, docs/BILLING.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from batches.execution.record import Finished, Recorder
from batches.interactive import feed as feed_module
from batches.interactive.feed import InteractiveFeed
from batches.interactive.service import interactive_accept
from batches.models import Batch, BatchItem
from batches.queue import EngineKey, items_claim
from billing.models import LedgerEntry, UsageEvent, UsageRollup
from billing.pricing import TokenPrices, token_charge
from inference.dialects import DIALECTS
from inference.engine.types import FINISH_STOP, Choice, GenerationResult
from tests.batches.conftest import finalize, rows, submit
from tests.conftest import INTERACTIVE_PRICES, Api, Tenant, content_of, parse_jsonl

pytestmark = pytest.mark.django_db

THOUGHT = "<think>Let me think about it.</think>"
ANSWER = "The answer."


@pytest.fixture
def thinking(tiny_model_dir: Path) -> Any:
    """The demo model's tokenizer, speaking a dialect that reasons (qwen3)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.dialect = DIALECTS["qwen3"]
    return tokenizer


def _result(tokenizer: Any, generation_id: str, text: str) -> GenerationResult:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return GenerationResult(
        id=generation_id,
        choices=[Choice(index=0, token_ids=ids, text=text, finish_reason=FINISH_STOP)],
        prompt_tokens=9,
        completion_tokens=len(ids),
        cached_tokens=0,
        busy_seconds=0.01,
    )


def _reasoning_events(item_id: int) -> list[int]:
    return list(
        UsageEvent.objects.filter(item_id=item_id, kind="reasoning_tokens").values_list(
            "quantity", flat=True
        )
    )


def test_a_rows_reasoning_reaches_its_item_the_batch_the_receipt_and_the_rollup(
    api: Api, catalog_model, thinking
):
    data = submit(api, rows(2))
    key = EngineKey(Batch.objects.get(id=data["id"]).revision_id)
    thought, plain = sorted(items_claim(key=key, worker_id="w", limit=2), key=lambda i: i.index)
    results = {
        thought.id: _result(thinking, thought.request_id, THOUGHT + ANSWER),
        plain.id: _result(thinking, plain.request_id, ANSWER),  # no reasoning: counts 0
    }
    Recorder(owner="w", tokenizer=thinking).write(
        [Finished(i, results[i.id]) for i in (thought, plain)]
    )

    reasoning = len(thinking.encode(THOUGHT, add_special_tokens=False))
    assert 0 < reasoning < results[thought.id].completion_tokens
    items = {i.id: i for i in BatchItem.objects.filter(batch_id=data["id"])}
    assert items[thought.id].usage_reasoning_tokens == reasoning
    assert items[plain.id].usage_reasoning_tokens == 0
    # The events and the rollup, written with the rows: a detail of the output tokens.
    assert _reasoning_events(thought.id) == [reasoning]
    assert _reasoning_events(plain.id) == []
    rollup = UsageRollup.objects.get()
    assert rollup.reasoning_tokens == reasoning
    assert rollup.output_tokens == sum(r.completion_tokens for r in results.values())

    batch = finalize(data["id"])
    assert batch is not None and batch.status == "completed"
    batch_usage = batch.usage
    assert batch_usage is not None
    assert batch_usage["output_tokens_details"] == {"reasoning_tokens": reasoning}
    assert batch_usage["output_tokens"] == rollup.output_tokens
    assert api.get(f"/v1/batches/{batch.id}").json()["usage"] == batch.usage
    out = parse_jsonl(content_of(api.get(f"/v1/files/{batch.output_file_id}/content")))
    bodies = {row["custom_id"]: row["response"]["body"] for row in out}
    assert bodies[thought.custom_id]["choices"][0]["message"]["reasoning_content"]
    prices = TokenPrices(
        batch.price_input or 0, batch.price_cached_input or 0, batch.price_output or 0
    )
    for item in (thought, plain):
        receipt = api.get(f"/v1/requests/{item.request_id}").json()
        usage = receipt["usage"]
        assert usage == bodies[item.custom_id]["usage"]  # the receipt says what the row says
        assert usage["completion_tokens_details"]["reasoning_tokens"] == (
            reasoning if item is thought else 0
        )
        # Charged as output tokens, reasoning or not: no price of its own.
        assert int(receipt["charge_microusd"]) == token_charge(
            prices, prompt=9, cached=0, completion=usage["completion_tokens"]
        )


def test_a_failed_row_counts_no_reasoning(api: Api, catalog_model, thinking):
    data = submit(api, rows(1))
    key = EngineKey(Batch.objects.get(id=data["id"]).revision_id)
    (item,) = items_claim(key=key, worker_id="w", limit=1)
    failed = _result(thinking, item.request_id, THOUGHT + ANSWER)
    failed.error = "internal_error"
    Recorder(owner="w", tokenizer=thinking).write([Finished(item, failed)])
    assert BatchItem.objects.get(id=item.id).usage_reasoning_tokens == 0
    assert _reasoning_events(item.id) == []
    assert UsageRollup.objects.get().reasoning_tokens == 0


# -- interactive requests -------------------------------------------------------------------


def _feed(accepted: Any, tokenizer: Any, replies: list[tuple[str, dict[str, Any]]]) -> Any:
    feed = InteractiveFeed(
        EngineKey(accepted.revision_id, ""),
        tokenizer=tokenizer,
        context_length=64,
        max_rows=4,
        engine_rows=lambda: 0,
        submit=lambda request: None,
    )
    submitted = accepted.submitted
    feed._inflight[submitted.generation_id] = submitted
    feed._rows = 1

    def reply(to: Any, kind: str, **fields: Any) -> bool:
        # What was settled by the time anything goes back to the client.
        settled = LedgerEntry.objects.filter(request_id=to.id, kind="charge").exists()
        replies.append((kind, {**fields, "settled": settled}))
        return True

    feed._reply = reply  # type: ignore[method-assign,assignment]
    return feed


def _accepted(tenant: Tenant) -> Any:
    body = {
        "model": "boardwalk/tiny-chat",
        "messages": [{"role": "user", "content": "Hello there"}],
        "max_completion_tokens": 64,
    }
    accepted = interactive_accept(org=tenant.org, data=body)
    accepted.admission.release()
    return accepted


@pytest.mark.parametrize("text", [THOUGHT + ANSWER, ANSWER], ids=["reasoning", "none"])
def test_an_interactive_answer_is_settled_first_with_its_reasoning_count(
    tenant: Tenant, catalog_model, thinking, text: str
):
    accepted = _accepted(tenant)
    replies: list[tuple[str, dict[str, Any]]] = []
    result = _result(thinking, accepted.submitted.generation_id, text)
    _feed(accepted, thinking, replies).finished(result)

    [(kind, reply)] = replies
    assert kind == "result" and reply["settled"]
    usage = reply["body"]["usage"]
    reasoning = usage["completion_tokens_details"]["reasoning_tokens"]
    assert reasoning == (
        len(thinking.encode(THOUGHT, add_special_tokens=False)) if text != ANSWER else 0
    )
    events = {
        e.kind: e.quantity for e in UsageEvent.objects.filter(request_id=accepted.submitted.id)
    }
    assert events.get("reasoning_tokens", 0) == reasoning
    assert events["output_tokens"] == result.completion_tokens
    interactive = UsageRollup.objects.get(usage_class="interactive")
    assert interactive.reasoning_tokens == reasoning
    charge = LedgerEntry.objects.get(request_id=accepted.submitted.id, kind="charge")
    assert charge.amount_microusd == token_charge(
        TokenPrices(*INTERACTIVE_PRICES), prompt=9, cached=0, completion=result.completion_tokens
    )


def test_an_answer_that_cannot_be_read_is_still_settled_before_the_error(
    tenant: Tenant, catalog_model, thinking, monkeypatch: pytest.MonkeyPatch
):
    def unreadable(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise ValueError("unreadable")

    monkeypatch.setattr(feed_module, "result_body", unreadable)
    accepted = _accepted(tenant)
    replies: list[tuple[str, dict[str, Any]]] = []
    result = _result(thinking, accepted.submitted.generation_id, THOUGHT + ANSWER)
    with pytest.raises(ValueError, match="unreadable"):
        _feed(accepted, thinking, replies).finished(result)
    assert replies == []
    assert LedgerEntry.objects.filter(request_id=accepted.submitted.id, kind="charge").exists()
    kinds = set(
        UsageEvent.objects.filter(request_id=accepted.submitted.id).values_list("kind", flat=True)
    )
    assert "output_tokens" in kinds and "reasoning_tokens" not in kinds
