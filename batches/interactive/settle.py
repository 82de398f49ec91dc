"""Metering and settling one interactive request, in one transaction, where it ran.

The same path as a batch row: usage facts (billing.metering, class "interactive") and the
credit ledger (billing.services.credit_settle: the hold taken at acceptance released, the
charge appended). A request that succeeded, or was cut short because its client went away
(a closed stream, a web process or broker that failed under it), pays its prompt and the
tokens generated until it stopped, as OpenAI bills a cancelled stream: catalog requests at
the prices fixed at acceptance, deployment requests their engine time (their share of each
step). A request that ended in an error pays nothing (docs/BILLING.md, "Interactive
requests"); the web tier voids the ones it answered with an error (service.interactive_void).
"""

from __future__ import annotations

import hashlib

from django.db import transaction

from batches.interactive.messages import Submitted
from billing.metering import Outcome, UsageFacts, seconds_to_microseconds, usage_record
from billing.pricing import TokenPrices, gpu_charge, token_charge
from billing.services import credit_settle
from inference.engine.types import GenerationResult


def event_item_id(request_id: str) -> int:
    """The usage events' item id of an interactive request: negative, so it never meets a
    BatchItem's, and derived from the request id, so a second settle of it is refused by
    `usage_event_once` instead of counted twice."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return -1 - (int.from_bytes(digest, "big") >> 1)


def interactive_charge(submitted: Submitted, result: GenerationResult) -> int:
    if result.error and not result.aborted:
        return 0
    if submitted.prices is not None:
        return token_charge(
            TokenPrices(*submitted.prices),
            prompt=result.prompt_tokens,
            cached=result.cached_tokens,
            completion=result.completion_tokens,
        )
    return gpu_charge(
        microseconds=seconds_to_microseconds(result.busy_seconds),
        price_per_second=submitted.gpu_second_price,
    )


def interactive_settle(
    submitted: Submitted, result: GenerationResult, *, revision_id: str, reasoning_tokens: int = 0
) -> int:
    """Record the request's usage and charge; returns the charge in µUSD.

    `reasoning_tokens`: the part of the completion the model spent reasoning, as its answer's
    usage counts it (`completion_tokens_details.reasoning_tokens`); metered as a detail of
    the output tokens, charged as output like the rest of them."""
    outcome: Outcome = "cut" if result.aborted else ("failed" if result.error else "succeeded")
    counted = outcome != "failed"
    charge = interactive_charge(submitted, result)
    with transaction.atomic():
        usage_record(
            facts=[
                UsageFacts(
                    org_id=submitted.org_id,
                    request_id=submitted.id,
                    item_id=event_item_id(submitted.id),
                    attempt=0,
                    revision_id=revision_id,
                    deployment_id=submitted.deployment_id,
                    outcome=outcome,
                    prompt_tokens=result.prompt_tokens,
                    cached_tokens=result.cached_tokens if counted else 0,
                    completion_tokens=result.completion_tokens if counted else 0,
                    reasoning_tokens=reasoning_tokens if counted else 0,
                    gpu_microseconds=seconds_to_microseconds(result.busy_seconds),
                    usage_class="interactive",
                )
            ]
        )
        credit_settle(
            org_id=submitted.org_id,
            request_id=submitted.id,
            charge_microusd=charge,
            revision_id=revision_id,
            deployment_id=submitted.deployment_id,
            usage_class="interactive",
        )
    return charge
