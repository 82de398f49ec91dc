"""Interactive money at the edges (docs/BILLING.md, "Interactive requests"): a request
answered with an error is never charged, whoever settles first; a request cut short pays its
prompt and the tokens generated before it stopped; every hold is released once."""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest
import redis
from django.db.models import Sum

from batches.interactive import relay
from batches.interactive.messages import (
    encode_reply,
    feed_alive_flag,
    reply_channel,
)
from batches.interactive.service import interactive_accept, interactive_void
from batches.interactive.settle import interactive_settle
from billing.models import LedgerEntry, UsageEvent, UsageRollup
from billing.pricing import TokenPrices, token_charge
from billing.selectors import credit_for_org
from boardwalk.channels import channels
from inference.engine.types import FINISH_LENGTH, Choice, GenerationResult
from tests.conftest import INTERACTIVE_PRICES, Tenant

pytestmark = pytest.mark.usefixtures("short_linger")

BODY = {
    "model": "boardwalk/tiny-chat",
    "messages": [{"role": "user", "content": "Hello there"}],
    "max_completion_tokens": 8,
}


def _accepted(tenant: Tenant) -> Any:
    accepted = interactive_accept(org=tenant.org, data=dict(BODY))
    accepted.admission.release()
    return accepted


def _result(accepted: Any, *, completion: int, aborted: bool = False, error: str | None = None):
    choices = (
        []
        if aborted or error
        else [Choice(index=0, token_ids=[5] * completion, text="hi", finish_reason=FINISH_LENGTH)]
    )
    return GenerationResult(
        id=accepted.submitted.generation_id,
        choices=choices,
        prompt_tokens=7,
        completion_tokens=completion,
        cached_tokens=0,
        busy_seconds=0.01,
        aborted=aborted,
        error=error,
    )


def _kinds(request_id: str) -> dict[str, list[int]]:
    kinds: dict[str, list[int]] = {}
    for entry in LedgerEntry.objects.filter(request_id=request_id).order_by("id"):
        kinds.setdefault(entry.kind, []).append(entry.amount_microusd)
    return kinds


def _spend(tenant: Tenant) -> int:
    total = UsageRollup.objects.filter(org=tenant.org).aggregate(s=Sum("spend_microusd"))["s"]
    return int(total or 0)


@pytest.mark.django_db
def test_a_cut_request_pays_its_prompt_and_the_tokens_generated_before_it_stopped(
    tenant, catalog_model
):
    before = credit_for_org(org_id=tenant.org.id)
    accepted = _accepted(tenant)

    charge = interactive_settle(
        accepted.submitted, _result(accepted, completion=3, aborted=True), revision_id="r"
    )

    expected = token_charge(TokenPrices(*INTERACTIVE_PRICES), prompt=7, cached=0, completion=3)
    assert charge == expected > 0
    assert _kinds(accepted.submitted.id)["charge"] == [expected]
    events = {
        e.kind: e.quantity for e in UsageEvent.objects.filter(request_id=accepted.submitted.id)
    }
    assert (events["input_tokens"], events["output_tokens"]) == (7, 3)
    after = credit_for_org(org_id=tenant.org.id)
    assert (after.balance, after.held) == (before.balance - expected, before.held)


@pytest.mark.django_db
def test_a_request_that_ended_in_an_error_pays_nothing(tenant, catalog_model):
    before = credit_for_org(org_id=tenant.org.id)
    accepted = _accepted(tenant)

    charge = interactive_settle(
        accepted.submitted, _result(accepted, completion=0, error="internal_error"), revision_id="r"
    )

    assert charge == 0
    assert "charge" not in _kinds(accepted.submitted.id)
    assert credit_for_org(org_id=tenant.org.id) == before


@pytest.mark.django_db
def test_a_request_voided_first_is_not_charged_by_the_worker_that_ran_it_after_all(
    tenant, catalog_model
):
    before = credit_for_org(org_id=tenant.org.id)
    accepted = _accepted(tenant)

    assert interactive_void(accepted) == 0  # the web answered 503 while the worker ran on
    interactive_settle(accepted.submitted, _result(accepted, completion=8), revision_id="r")
    interactive_void(accepted)  # a repeat is a no-op

    assert _kinds(accepted.submitted.id) == {
        "hold": [_kinds(accepted.submitted.id)["hold"][0]],
        "release": [_kinds(accepted.submitted.id)["hold"][0]],
        "charge": [0],
    }
    assert credit_for_org(org_id=tenant.org.id) == before
    assert _spend(tenant) == 0


@pytest.mark.django_db
def test_a_charge_made_before_the_error_answer_is_refunded_once(tenant, catalog_model):
    before = credit_for_org(org_id=tenant.org.id)
    accepted = _accepted(tenant)
    charge = interactive_settle(
        accepted.submitted, _result(accepted, completion=8), revision_id=accepted.revision_id
    )
    assert _spend(tenant) == charge > 0

    assert interactive_void(accepted) == charge  # the result never reached the client
    assert interactive_void(accepted) == 0

    kinds = _kinds(accepted.submitted.id)
    assert (kinds["charge"], kinds["refund"]) == ([charge], [charge])
    assert credit_for_org(org_id=tenant.org.id) == before
    assert _spend(tenant) == 0


class CappedPops:
    """The process's channels, each pop waiting at most `cap` seconds (Redis's BLPOP cap)."""

    def __init__(self, real: Any, cap: float) -> None:
        self.real, self.cap = real, cap

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def pop(self, key: str, *, timeout: float) -> bytes | None:
        return self.real.pop(key, timeout=min(timeout, self.cap))


@pytest.mark.django_db
def test_replies_wait_the_whole_timeout_however_short_one_pop_is(
    tenant, catalog_model, settings, monkeypatch
):
    settings.INTERACTIVE_TIMEOUT_SECONDS = 3.0
    accepted = _accepted(tenant)
    capped = CappedPops(channels(), cap=0.2)
    monkeypatch.setattr(relay, "channels", lambda: capped)
    body = {"id": "chatcmpl-x", "choices": []}
    import threading

    later = threading.Timer(
        1.0,
        lambda: channels().push(
            reply_channel(accepted.submitted.id),
            encode_reply(accepted.submitted, "result", body=body),
            ttl=30,
        ),
    )
    later.start()
    try:
        replies = list(relay.replies(accepted))
    finally:
        later.cancel()
        interactive_void(accepted)

    assert replies == [{"kind": "result", "body": body}]


@pytest.mark.django_db
def test_a_request_whose_worker_stopped_reporting_ends_as_worker_lost(tenant, catalog_model):
    accepted = _accepted(tenant)
    accepted.worker = "worker-that-died"
    channels().flag(feed_alive_flag(accepted.worker), ttl=0.5)  # its last report

    started = time.monotonic()
    replies = list(relay.replies(accepted))  # the timeout is 600 s: it must not wait it out
    interactive_void(accepted)

    assert replies == [{"kind": "error", "code": relay.WORKER_LOST}]
    assert time.monotonic() - started < 60
    hold = _kinds(accepted.submitted.id)["hold"]
    assert _kinds(accepted.submitted.id)["release"] == hold


# -- over HTTP, with the in-process worker ------------------------------------------------


class BrokenReplies:
    """The process's channels, whose reply pops fail after the first ("taken"): the broker
    failed under the web process while the worker ran the request."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.reply_pops = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def pop(self, key: str, *, timeout: float) -> bytes | None:
        if key.startswith("interactive:reply:"):
            if self.reply_pops >= 1:
                raise redis.ConnectionError("broker down")
            message = self.real.pop(key, timeout=timeout)
            self.reply_pops += message is not None
            return message
        return self.real.pop(key, timeout=timeout)


@pytest.mark.django_db(transaction=True)
def test_a_plain_request_answered_503_after_a_broker_failure_is_never_charged(
    sdk, tenant, fake_engine, in_process_worker, monkeypatch
):
    before = credit_for_org(org_id=tenant.org.id)
    broken = BrokenReplies(channels())
    monkeypatch.setattr(relay, "channels", lambda: broken)

    with pytest.raises(openai.InternalServerError) as failed:
        sdk.chat.completions.create(
            model="boardwalk/tiny-chat",
            messages=BODY["messages"],
            max_completion_tokens=200,  # 4 s of steps
        )

    assert failed.value.status_code == 503 and failed.value.code == "backend_unavailable"
    request_id = LedgerEntry.objects.get(org=tenant.org, kind="hold").request_id
    deadline = time.monotonic() + 30
    while not UsageEvent.objects.filter(request_id=request_id).exists():
        assert time.monotonic() < deadline, "the worker never settled the request"
        time.sleep(0.05)
    kinds = _kinds(request_id)
    assert kinds["charge"] == [0] and "refund" not in kinds  # voided before the worker settled
    assert kinds["release"] == kinds["hold"]
    assert credit_for_org(org_id=tenant.org.id) == before
    # The worker stopped it (abort flag), instead of generating its 200 tokens.
    output = UsageEvent.objects.filter(request_id=request_id, kind="output_tokens").first()
    assert output is None or output.quantity < 200
