"""Batch writes: create (with idempotency, credit hold and capacity checks) and cancel."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from batches import idempotency
from batches.batchrouter import assignment_check_target
from batches.models import Batch, BatchItem
from batches.queue import items_insert
from batches.requests import BatchSubmission
from batches.tasks import engine_wake, finalize
from billing.pricing import TokenPrices, gpu_charge, token_hold
from billing.selectors import credit_for_org, revision_gpu_microseconds_per_token
from billing.services import credit_hold
from boardwalk import clock
from boardwalk.broker import send_after_commit
from boardwalk.codes import ErrorCode
from boardwalk.errors import (
    CapacityExceeded,
    Conflict,
    InsufficientCredit,
    InvalidRequest,
    ServiceUnavailable,
)
from boardwalk.faultpoints import fault_point
from boardwalk.logs import exception_trace
from boardwalk.models import Organization
from files.counting import TemplateRefused, file_prompt_tokens
from files.crypto import Keyring, new_data_key
from files.limits import ACCEPTED_INPUT_TTL
from files.models import File
from files.selectors import file_get_for_org
from files.services import ItemSpan, line_index_span
from inference.chat_completions import max_output_tokens
from inference.selectors import ModelNotUsable, ResolvedModel, model_resolve
from inference.tokenization import TokenizerUnavailable, chat_tokenizer_for

logger = logging.getLogger(__name__)

MAX_UNFINISHED_PER_ORG = 4
MAX_PRIVATE_ITEMS = 95


@dataclass(frozen=True)
class ItemPlan:
    index: int
    custom_id: str
    span: ItemSpan
    max_tokens: int
    n: int
    prompt_tokens: int


@dataclass(frozen=True)
class BatchPlan:
    """Everything acceptance fixes, computed before any row is written."""

    file: File
    target: ResolvedModel
    items: list[ItemPlan]
    hold_microusd: int

    @property
    def prompt_tokens(self) -> int:
        return sum(i.prompt_tokens for i in self.items)

    @property
    def max_output_tokens(self) -> int:
        return sum(i.max_tokens * i.n for i in self.items)


def _input_file(*, org: Organization, file_id: str) -> File:
    file = file_get_for_org(org=org, file_id=file_id)
    problem = None
    if file.purpose != File.Purpose.BATCH:
        problem = "is not a batch input file (purpose must be 'batch')"
    elif file.status != File.Status.PROCESSED or file.wrapped_key is None:
        problem = "was deleted"
    elif file.expires_at is not None and file.expires_at <= clock.now():
        problem = "has expired (unused input files are kept 24 hours); upload it again"
    elif Batch.objects.filter(input_file=file).exists():
        problem = "is already the input of another batch; upload it again for a new batch"
    if problem:
        raise InvalidRequest(
            f"Input file {file.id} {problem}.",
            code=ErrorCode.INVALID_INPUT_FILE_ID,
            param="input_file_id",
        )
    return file


def _counted_items(file: File, revision_id: str) -> list[ItemPlan] | None:
    """The items as counted after the upload, when that was for `revision_id`: no content is read.

    None when the count was for another revision (the catalog model moved on since), has not
    finished yet or failed; the caller then counts the lines itself.
    """
    index = file.line_index or []
    counts = file.prompt_tokens
    if file.prompt_tokens_revision != revision_id or counts is None or len(counts) != len(index):
        return None
    return [
        ItemPlan(i, row[2], line_index_span(row), row[3], row[4], counts[i])
        for i, row in enumerate(index)
    ]


def _count_items(file: File, tokenizer: Any) -> list[ItemPlan]:
    index = file.line_index or []
    counted = file_prompt_tokens(file=file, tokenizer=tokenizer)
    return [
        ItemPlan(i, row[2], line_index_span(row), max_output_tokens(body), row[4], tokens)
        for i, (row, (body, tokens)) in enumerate(zip(index, counted, strict=True))
    ]


def _recheck_input(file: File) -> None:
    """Inside the acceptance transaction: the file, locked, is still there.

    `_plan` read it outside the transaction (counting may decrypt the file); a delete
    that landed since then must win: one of the two requests fails, never both succeed.
    The delete locks the same row, so it waits for us or we see its result.
    """
    current = File.objects.select_for_update().filter(pk=file.pk).first()
    if current is None or current.status != File.Status.PROCESSED or current.wrapped_key is None:
        raise InvalidRequest(
            f"Input file {file.id} was deleted.",
            code=ErrorCode.INVALID_INPUT_FILE_ID,
            param="input_file_id",
        )


def _plan(*, org: Organization, submission: BatchSubmission) -> BatchPlan:
    file = _input_file(org=org, file_id=submission.input_file_id)
    try:
        target = model_resolve(org=org, name=file.model)
    except ModelNotUsable as exc:
        raise InvalidRequest(
            f"The input file's model cannot be used: {exc.message}",
            code=ErrorCode(exc.code),
            param="input_file_id",
        ) from exc
    try:
        # Loaded even when the stored counts serve (cached per process, so nearly free): a
        # revision whose tokenizer cannot load cannot run either, and answers 503 here.
        tokenizer = chat_tokenizer_for(target.revision)
    except TokenizerUnavailable as exc:
        logger.error("tokenizer of %s failed to load: %s", target.revision.id, exception_trace(exc))
        raise ServiceUnavailable(
            f"Model {target.name!r} is unavailable right now (its revision cannot be loaded); "
            "retry later or contact support.",
            code=ErrorCode.MODEL_UNAVAILABLE,
        ) from exc
    items = _counted_items(file, target.revision.id)
    if items is None:
        # Ids only: which revision the stored counts are for, if any (the content never).
        logger.info(
            "counting prompt tokens of %s for %s (stored counts are for %r)",
            file.id,
            target.revision.id,
            file.prompt_tokens_revision,
        )
        try:
            items = _count_items(file, tokenizer)
        except TemplateRefused as exc:
            # A 400 naming the line, never a 500: the line is what to change (its content is
            # never quoted). Nothing is created.
            custom_id = (file.line_index or [])[exc.index][2]
            raise InvalidRequest(
                f"Request {exc.index + 1} of the input file (custom_id {custom_id!r}) cannot be "
                f"rendered by the chat template of {target.name!r}: the template refuses its "
                "messages or tools. Fix that request and upload the file again.",
                code=ErrorCode.INVALID_INPUT_FILE,
                param="input_file_id",
            ) from exc
        except Exception:
            # A DELETE that landed while we read destroys the key and the blob under us; the
            # row lock waits for that delete to commit, so the check sees its outcome.
            with transaction.atomic():
                _recheck_input(file)
            raise
    if target.catalog is not None:
        prices = TokenPrices(
            target.catalog.price_input,
            target.catalog.price_cached_input,
            target.catalog.price_output,
        )
        hold = sum(
            token_hold(prices, prompt=i.prompt_tokens, max_output=i.max_tokens * i.n) for i in items
        )
    elif target.deployment is not None:
        tokens = sum(i.prompt_tokens + i.max_tokens * i.n for i in items)
        per_token = revision_gpu_microseconds_per_token(revision_id=target.revision.id)
        if per_token is None:
            per_token = settings.GPU_MICROSECONDS_PER_TOKEN_ESTIMATE
        hold = gpu_charge(
            microseconds=tokens * per_token, price_per_second=target.deployment.gpu_second_price
        )
    else:
        raise ValueError(f"model {target.name!r} resolved to neither catalog nor deployment")
    assignment_check_target(
        submission.assignment,
        prices=(
            (
                target.catalog.price_input,
                target.catalog.price_cached_input,
                target.catalog.price_output,
            )
            if target.catalog is not None
            else None
        ),
        file_format=file.format or None,
    )
    return BatchPlan(file=file, target=target, items=items, hold_microusd=hold)


def _check_capacity(*, org: Organization, plan: BatchPlan) -> None:
    """429s (docs/API.md "Batches"). Caller holds the org row lock, so counts cannot race."""
    unfinished = Batch.objects.filter(org=org, status__in=Batch.UNFINISHED).count()
    if unfinished >= MAX_UNFINISHED_PER_ORG:
        raise CapacityExceeded(
            f"Your organization already has {unfinished} unfinished batches (the limit is "
            f"{MAX_UNFINISHED_PER_ORG}); wait for one to finish or cancel one.",
            code=ErrorCode.TOO_MANY_UNFINISHED_BATCHES,
        )
    if plan.target.kind == "deployment" and len(plan.items) > MAX_PRIVATE_ITEMS:
        raise CapacityExceeded(
            f"Batches on a private deployment take at most {MAX_PRIVATE_ITEMS} items; this file "
            f"has {len(plan.items)}. Split it into smaller files.",
            code=ErrorCode.PRIVATE_BATCH_TOO_LARGE,
            retryable=False,  # the same file never fits: the SDK must not resend it
        )
    queued = BatchItem.objects.live().filter(state=BatchItem.State.PENDING).count()
    if queued + len(plan.items) > settings.MAX_QUEUED_ITEMS:
        raise CapacityExceeded(
            "The batch queue is full right now; retry later.",
            code=ErrorCode.QUEUE_BACKLOG_FULL,
            # At most 120 s, or the OpenAI SDK gives up instead of waiting.
            retry_after=60,
        )


def _check_credit(*, org: Organization, plan: BatchPlan) -> None:
    available = credit_for_org(org_id=org.id).available
    if available < plan.hold_microusd:
        raise InsufficientCredit(
            f"This batch may cost up to {plan.hold_microusd} µUSD but your organization has "
            f"{available} µUSD of available credit. Ask an administrator for more credit or "
            "submit fewer or shorter requests.",
            code=ErrorCode.INSUFFICIENT_CREDIT,
        )


def _create_rows(*, org: Organization, plan: BatchPlan, submission: BatchSubmission) -> Batch:
    now = clock.now()
    target = plan.target
    key_id, wrapped = Keyring.current().wrap(new_data_key())
    fields: dict[str, Any]
    if target.catalog is not None:
        fields = {
            "billing": Batch.Billing.CATALOG,
            "price_input": target.catalog.price_input,
            "price_cached_input": target.catalog.price_cached_input,
            "price_output": target.catalog.price_output,
        }
    elif target.deployment is not None:
        fields = {
            "billing": Batch.Billing.GPU_TIME,
            "deployment": target.deployment,
            "gpu_second_price": target.deployment.gpu_second_price,
        }
    else:
        raise ValueError(f"model {target.name!r} resolved to neither catalog nor deployment")
    batch = Batch.objects.create(
        org=org,
        input_file=plan.file,
        model_name=target.name,
        revision=target.revision,
        metadata=submission.metadata,
        total=len(plan.items),
        hold_microusd=plan.hold_microusd,
        key_id=key_id,
        wrapped_key=wrapped,
        created_at=now,
        expires_at=submission.assignment.expires_at(now),
        **fields,
    )
    deployment_id = target.deployment.id if target.deployment else ""
    items_insert(
        shared={
            "batch_id": batch.id,
            "revision_id_key": target.revision.id,
            "deployment_id_key": deployment_id,
            "org_id_key": org.id,
            "deadline": batch.expires_at,
        },
        rows=[
            {
                "index": i.index,
                "custom_id": i.custom_id,
                "line_offset": i.span[0],
                "line_length": i.span[1],
                "section_offset": i.span[2],
                "section_length": i.span[3],
                "max_tokens": i.max_tokens,
                "n": i.n,
                "prompt_tokens": i.prompt_tokens,
            }
            for i in plan.items
        ],
    )
    credit_hold(org_id=org.id, batch_id=batch.id, amount_microusd=plan.hold_microusd)
    # Accepted input is kept until the batch ends, and 48 hours after acceptance at most.
    File.objects.filter(pk=plan.file.pk).update(expires_at=now + ACCEPTED_INPUT_TTL)
    return batch


def batch_create(
    *, org: Organization, submission: BatchSubmission, idempotency_key: str, request_digest: str
) -> Batch:
    while True:
        claim = idempotency.key_acquire(org=org, key=idempotency_key, digest=request_digest)
        if isinstance(claim, Batch):
            return claim
        try:
            batch, plan = _create_claimed(org=org, submission=submission, claim=claim)
        except idempotency.ClaimLost:
            continue  # presumed dead and taken over: the key now answers with their batch
        except BaseException:
            idempotency.key_release(claim=claim)
            raise
        finally:
            idempotency.key_done(claim=claim)
        logger.info(
            "batch accepted id=%s org=%s items=%s hold=%s",
            batch.id,
            org.id,
            batch.total,
            plan.hold_microusd,
        )
        return batch


def _create_claimed(
    *, org: Organization, submission: BatchSubmission, claim: idempotency.KeyClaim
) -> tuple[Batch, BatchPlan]:
    fault_point("batch_create.key_taken")
    plan = _plan(org=org, submission=submission)
    with transaction.atomic():
        # One org's creates serialize here: capacity and credit are checked and held
        # atomically, so two racing batches cannot both spend the last credit.
        Organization.objects.select_for_update().get(pk=org.pk)
        _recheck_input(plan.file)
        _check_capacity(org=org, plan=plan)
        _check_credit(org=org, plan=plan)
        try:
            with transaction.atomic():
                batch = _create_rows(org=org, plan=plan, submission=submission)
        except IntegrityError as exc:
            raise InvalidRequest(
                f"Input file {plan.file.id} is already the input of another batch.",
                code=ErrorCode.INVALID_INPUT_FILE_ID,
                param="input_file_id",
            ) from exc
        idempotency.key_complete(claim=claim, batch=batch)
        send_after_commit(engine_wake, batch.revision_id, batch.deployment_id or "")
        fault_point("batch_create.in_transaction")
    return batch, plan


def batch_estimate(*, org: Organization, submission: BatchSubmission) -> dict:
    plan = _plan(org=org, submission=submission)
    credit = credit_for_org(org_id=org.id)
    return {
        "object": "batch.estimate",
        "input_file_id": plan.file.id,
        "model": plan.target.name,
        "model_config_id": plan.target.revision.id,
        "billing": "catalog" if plan.target.kind == "catalog" else "gpu_time",
        "request_count": len(plan.items),
        "prompt_tokens": plan.prompt_tokens,
        "max_output_tokens": plan.max_output_tokens,
        "max_charge_microusd": str(plan.hold_microusd),
        "available_credit_microusd": str(credit.available),
        "credit_sufficient": credit.available >= plan.hold_microusd,
    }


def batch_cancel(*, batch: Batch) -> Batch:
    """in_progress → cancelling; repeating it is harmless; terminal batches refuse (409)."""
    now = clock.now()
    moved = (
        Batch.objects.running()
        .filter(id=batch.id)
        .update(status=Batch.Status.CANCELLING, outcome=Batch.Status.CANCELLED, cancelling_at=now)
    )
    batch.refresh_from_db()
    if moved:
        logger.info("batch cancelling id=%s", batch.id)
        send_after_commit(finalize, batch.id)
        return batch
    if batch.is_terminal:
        raise Conflict(
            f"Batch {batch.id} is already {batch.status}; it cannot be cancelled.",
            code=ErrorCode.BATCH_NOT_CANCELLABLE,
        )
    return batch  # cancelling or finalizing already: unchanged
