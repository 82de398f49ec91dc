"""What a process that died mid-request leaves behind is recovered: the credit hold of an
interactive request no one settled is released by the sweep, once, never after a settle; an
organization's concurrency slot that was never given back stops counting."""

from __future__ import annotations

import datetime as dt
import secrets

import pytest

from batches.interactive.config import setting
from batches.interactive.limits import _slot_ttl, admit
from batches.interactive.orphans import MARGIN_SECONDS
from batches.interactive.service import interactive_accept
from batches.interactive.settle import interactive_settle
from batches.sweeps import LEASES, sweep_work
from billing.models import LedgerEntry
from billing.selectors import credit_for_org
from billing.services import credit_hold
from boardwalk import clock
from boardwalk.errors import CapacityExceeded
from inference.engine.types import FINISH_LENGTH, Choice, GenerationResult

pytestmark = pytest.mark.django_db

BODY = {
    "model": "boardwalk/tiny-chat",
    "messages": [{"role": "user", "content": "Hello there"}],
    "max_completion_tokens": 8,
}


@pytest.fixture
def priced(catalog_model):
    catalog_model.price_input_interactive = 300_000
    catalog_model.price_output_interactive = 1_200_000
    catalog_model.save()
    return catalog_model


def _past_deadline() -> dt.timedelta:
    lifetime = setting("INTERACTIVE_QUEUE_SECONDS") + setting("INTERACTIVE_TIMEOUT_SECONDS")
    return dt.timedelta(seconds=lifetime + MARGIN_SECONDS + 1)


def _entries(request_id: str, kind: str) -> int:
    return LedgerEntry.objects.filter(request_id=request_id, kind=kind).count()


def accepted_request(tenant):
    accepted = interactive_accept(org=tenant.org, data=dict(BODY))
    accepted.admission.release()  # the web tier gave its slot back; the hold stays
    return accepted


def succeeded(accepted) -> GenerationResult:
    choice = Choice(index=0, token_ids=[5, 6], text="hi", finish_reason=FINISH_LENGTH)
    return GenerationResult(
        id=accepted.submitted.generation_id,
        choices=[choice],
        prompt_tokens=7,
        completion_tokens=2,
        cached_tokens=0,
        busy_seconds=0.01,
    )


def test_a_hold_no_worker_settled_is_released_once_after_its_deadline(tenant, priced):
    start = credit_for_org(org_id=tenant.org.id)
    accepted = accepted_request(tenant)
    request_id = accepted.submitted.id
    assert credit_for_org(org_id=tenant.org.id).held > start.held
    # Within its deadline a worker may still settle it: the sweep leaves it.
    assert sweep_work(only=[LEASES]).holds_released == 0
    assert _entries(request_id, "release") == 0
    with clock.travel(_past_deadline()):
        assert sweep_work(only=[LEASES]).holds_released == 1
        assert sweep_work(only=[LEASES]).holds_released == 0
    assert _entries(request_id, "release") == 1 and _entries(request_id, "hold") == 1
    after = credit_for_org(org_id=tenant.org.id)
    assert after.held == start.held and after.balance == start.balance
    # A worker that settles after all still bills what ran; the hold is not released twice.
    interactive_settle(accepted.submitted, succeeded(accepted), revision_id=accepted.revision_id)
    assert _entries(request_id, "release") == 1 and _entries(request_id, "charge") == 1


def test_a_batch_hold_is_never_taken_for_an_orphaned_request(tenant, priced):
    """The sweep finds interactive holds by their request_id: a batch's hold, as old as it
    may be, is the batch's finalization to release."""
    credit_hold(org_id=tenant.org.id, batch_id="batch_old", amount_microusd=900)
    accepted = accepted_request(tenant)
    with clock.travel(_past_deadline()):
        assert sweep_work(only=[LEASES]).holds_released == 1
    assert _entries(accepted.submitted.id, "release") == 1
    assert not LedgerEntry.objects.filter(batch_id="batch_old", kind="release").exists()
    release = LedgerEntry.objects.get(kind="release")
    assert (release.request_id, release.batch_id) == (accepted.submitted.id, "")


def test_a_settled_request_is_left_alone(tenant, priced):
    accepted = accepted_request(tenant)
    request_id = accepted.submitted.id
    interactive_settle(accepted.submitted, succeeded(accepted), revision_id=accepted.revision_id)
    settled = credit_for_org(org_id=tenant.org.id)
    with clock.travel(_past_deadline()):
        assert sweep_work(only=[LEASES]).holds_released == 0
    assert _entries(request_id, "release") == 1 and _entries(request_id, "charge") == 1
    assert credit_for_org(org_id=tenant.org.id) == settled


def test_a_slot_never_given_back_stops_counting_two_epochs_later(settings):
    settings.INTERACTIVE_MAX_CONCURRENT = 1
    org_id = "org_" + secrets.token_hex(6)
    period = _slot_ttl()
    start = 1_000 * period  # the start of an epoch
    admit(org_id=org_id, tokens=1, now=start)  # its process died: never released
    for later in (1.0, period + 1.0):  # the same epoch, and the next: it still counts
        with pytest.raises(CapacityExceeded):
            admit(org_id=org_id, tokens=1, now=start + later)
    recovered = admit(org_id=org_id, tokens=1, now=start + 2 * period + 1.0)
    assert recovered.headers["x-ratelimit-remaining-requests"] == "0"
    recovered.release()  # a slot given back is free at once
    admit(org_id=org_id, tokens=1, now=start + 2 * period + 2.0).release()
