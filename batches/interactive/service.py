"""Accepting an interactive request: its rules, model, price, limits and credit hold.

The body obeys exactly a batch row's rules (files.validation.rules, one rule list) but for
the fields only an interactive request takes: `stream`, `stream_options` and `service_tier`.
Media parts are refused for now (text only: the worker's interactive feed does not fetch or
decode media). Nothing here reads or logs content beyond counting the prompt's tokens.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from jinja2.exceptions import TemplateError

from batches.interactive.config import setting
from batches.interactive.limits import Admission, admission_tokens_take, slot_take
from batches.interactive.messages import Submitted, headroom_gauge
from batches.queue import EngineKey
from billing.pricing import TokenPrices, gpu_charge, token_hold
from billing.selectors import credit_for_org, revision_gpu_microseconds_per_token
from billing.services import credit_hold, credit_void
from boardwalk.channels import channels
from boardwalk.codes import ErrorCode
from boardwalk.errors import (
    CapacityExceeded,
    InsufficientCredit,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
)
from boardwalk.models import Organization
from files.validation import rules
from files.validation.report import ModelTarget
from inference.chat_completions import max_output_tokens
from inference.prompt_bounds import bounded_prompt_ids
from inference.selectors import ModelNotUsable, ResolvedModel, model_resolve
from inference.tokenization import TokenizerUnavailable, chat_tokenizer_for

SERVICE_TIERS = ("auto", "default", "flex")
_INTERACTIVE_ONLY = ("stream", "stream_options", "service_tier")


@dataclass
class Accepted:
    """A request that passed every check, with its slot and hold taken."""

    submitted: Submitted
    key: EngineKey
    admission: Admission
    include_usage: bool
    revision_id: str
    worker: str = ""  # the feed that took it (its "taken" reply says), watched while it runs


def _invalid(message: str, *, param: str | None = None, code: ErrorCode | None = None) -> Any:
    return InvalidRequest(message, code=code or ErrorCode.INVALID_REQUEST, param=param)


def _interactive_fields(body: dict[str, Any]) -> tuple[bool, bool, str]:
    """stream, include_usage, service_tier; removed from `body`, which then is a row body."""
    stream = body.pop("stream", None)
    options = body.pop("stream_options", None)
    tier = body.pop("service_tier", None)
    if stream is not None and not isinstance(stream, bool):
        raise _invalid("stream must be true or false.", param="stream")
    include_usage = False
    if options is not None:
        if not stream:
            raise _invalid(
                "stream_options is only allowed with stream: true.", param="stream_options"
            )
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise _invalid(
                "stream_options takes only include_usage (true or false).", param="stream_options"
            )
        value = options.get("include_usage")
        if value is not None and not isinstance(value, bool):
            raise _invalid(
                "stream_options.include_usage must be true or false.",
                param="stream_options.include_usage",
            )
        include_usage = bool(value)
    if tier is None:
        tier = "auto"
    if tier not in SERVICE_TIERS:
        raise _invalid(
            f"service_tier must be one of {', '.join(SERVICE_TIERS)}.", param="service_tier"
        )
    return bool(stream), include_usage, "default" if tier == "auto" else tier


def _resolve(org: Organization, body: dict[str, Any]) -> ResolvedModel:
    problems = rules.Problems()
    name = rules.check_model(body, problems)
    if name is None:
        message = problems[0][2]
        raise _invalid(
            message[0].upper() + message[1:] + ".",
            param="model",
            code=ErrorCode.MISSING_REQUIRED_PARAMETER if "add" in message else None,
        )
    try:
        target = model_resolve(org=org, name=name, interactive=True)
    except ModelNotUsable as exc:
        if exc.code in (ErrorCode.MODEL_NOT_FOUND, ErrorCode.MODEL_AMBIGUOUS):
            raise NotFound(exc.message, code=ErrorCode(exc.code), param="model") from exc
        # It exists but is not offered here (disabled, no interactive prices): retrying
        # cannot help until an operator acts, so a 400 (x-should-retry: false).
        raise _invalid(exc.message, param="model", code=ErrorCode(exc.code)) from exc
    if body.get("service_tier") == "flex" and target.catalog and not target.batch_enabled:
        # Flex pays the batch prices, and this model has none (docs/API.md).
        raise _invalid(
            f"service_tier 'flex' pays the batch prices and {name!r} is not offered for batch; "
            "send service_tier 'default'.",
            param="service_tier",
        )
    return target


def _check_rules(body: dict[str, Any], target: ResolvedModel) -> tuple[int, int]:
    problems = rules.Problems(keep=20)
    counts = rules.check_body(
        body,
        ModelTarget(
            name=target.name,
            context_length=target.revision.context_length,
            media=frozenset(),  # text only (see the module's doc)
            dialect=target.revision.dialect,
        ),
        problems,
    )
    if problems.total or counts is None:
        field, _, message = problems[0]
        message = message.replace("body.", "")  # a row's field names, without the row
        raise InvalidRequest(
            f"{message[0].upper()}{message[1:]}.",
            code=ErrorCode.INVALID_REQUEST,
            param=field.removeprefix("body."),
            details=[
                {"field": f.removeprefix("body."), "code": c, "message": m.replace("body.", "")}
                for f, c, m in problems
            ],
        )
    return counts


def _prices(target: ResolvedModel, tier: str) -> list[int] | None:
    catalog = target.catalog
    if catalog is None:
        return None
    if tier == "flex":  # spare capacity, sold at the batch prices
        return [catalog.price_input, catalog.price_cached_input, catalog.price_output]
    # Set: _resolve's model_resolve(interactive=True) refuses a model without them.
    return list(target.interactive_prices or ())


def _hold(target: ResolvedModel, prices: list[int] | None, *, prompt: int, most: int) -> int:
    if prices is not None:
        return token_hold(TokenPrices(*prices), prompt=prompt, max_output=most)
    if target.deployment is None:
        raise ValueError(f"model {target.name!r} is neither catalog nor deployment")
    per_token = revision_gpu_microseconds_per_token(revision_id=target.revision.id)
    if per_token is None:
        per_token = settings.GPU_MICROSECONDS_PER_TOKEN_ESTIMATE
    return gpu_charge(
        microseconds=(prompt + most) * per_token,
        price_per_second=target.deployment.gpu_second_price,
    )


def has_headroom(key: EngineKey) -> bool:
    """Whether some worker serving `key` reported a free row within the last seconds."""
    return channels().gauge_sum(headroom_gauge(key)) > 0


def interactive_accept(*, org: Organization, data: Any) -> Accepted:
    """Check the request and take its concurrency slot, token budget and credit hold."""
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code=ErrorCode.INVALID_BODY)
    body = dict(data)
    # The model first, as the schema says (docs/API.md): one the org cannot use is a 404
    # whatever else the body holds.
    target = _resolve(org, body)
    stream, include_usage, tier = _interactive_fields(body)
    max_tokens, n = _check_rules(body, target)
    try:
        tokenizer = chat_tokenizer_for(target.revision)
    except TokenizerUnavailable as exc:
        raise ServiceUnavailable(
            f"Model {target.name!r} is unavailable right now; retry later.",
            code=ErrorCode.MODEL_UNAVAILABLE,
        ) from exc
    key = EngineKey(target.revision.id, target.deployment.id if target.deployment else "")
    if tier == "flex" and not has_headroom(key):
        raise CapacityExceeded(
            f"No spare capacity for {target.name!r} right now (flex runs only on free rows); "
            "retry shortly, or send service_tier 'default'.",
            code=ErrorCode.RESOURCE_UNAVAILABLE,
            retry_after=setting("INTERACTIVE_FLEX_RETRY_AFTER"),
        )
    # The slot first: counting a prompt is the web tier's costliest work, and an
    # organization's requests in flight bound how much of it runs at once.
    admission = slot_take(org_id=org.id)
    try:
        most = max_output_tokens(body) * n
        context = target.revision.context_length
        # A prompt that surely exceeds the context is refused without being tokenized
        # (inference.prompt_bounds), as an upload's line is.
        try:
            ids = bounded_prompt_ids(tokenizer, body, context_length=context)
        except TemplateError as exc:
            # The template's own refusal ("roles must alternate") or its render bounds
            # (inference.tokenization): the messages are what to change.
            raise _invalid(
                f"The model's chat template cannot render these messages: {exc}",
                param="messages",
            ) from exc
        prompt = context + 1 if ids is None else len(ids)
        if prompt + max_output_tokens(body) > context:
            counted = "more than the context" if ids is None else f"{prompt} tokens"
            raise _invalid(
                f"The prompt ({counted}) plus max_completion_tokens ({max_tokens}) exceed the "
                f"model's context of {context} tokens; shorten either.",
                param="messages",
                code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            )
        admission_tokens_take(admission, tokens=prompt + most)
    except BaseException:
        admission.release()
        raise
    request_id = "req_" + secrets.token_hex(12)
    prices = _prices(target, tier)
    try:
        hold = _hold(target, prices, prompt=prompt, most=most)
        with transaction.atomic():
            Organization.objects.select_for_update().get(pk=org.pk)
            available = credit_for_org(org_id=org.id).available
            if available < hold:
                raise InsufficientCredit(
                    f"This request may cost up to {hold} µUSD and your organization has "
                    f"{available} µUSD of available credit."
                )
            if hold > 0:
                credit_hold(org_id=org.id, request_id=request_id, amount_microusd=hold)
    except BaseException:
        admission.release()
        raise
    submitted = Submitted(
        id=request_id,
        org_id=org.id,
        deployment_id=key.deployment_id,
        body=body,
        stream=stream,
        deadline=time.time() + setting("INTERACTIVE_QUEUE_SECONDS"),
        prices=prices,
        gpu_second_price=target.deployment.gpu_second_price if target.deployment else 0,
        service_tier=tier,
        prompt_ids=ids,  # counted here: the worker generates from them, tokenizing nothing
    )
    return Accepted(submitted, key, admission, include_usage, target.revision.id)


def interactive_void(accepted: Accepted) -> int:
    """The request was answered with an error: it costs nothing. Its hold goes back and its
    charge is settled at 0 under the ledger's key, so a worker that ran it after all charges
    nothing; a charge a worker made before the error answer is refunded (returned, µUSD)."""
    return credit_void(
        org_id=accepted.submitted.org_id,
        request_id=accepted.submitted.id,
        revision_id=accepted.revision_id,
        deployment_id=accepted.key.deployment_id,
        memo="answered with an error",
    )
