"""What a step's sampled tokens become: the engine's outputs.

Each sampled token is appended to its sequence, which then finishes when it sampled an
end-of-sequence token, its text reached a stop string (found by decoding.py) or it reached its
`max_new_tokens`: its choice is written on its request, and a request whose every choice
finished becomes its `GenerationResult`. A streaming sequence that goes on gives its new text
as a `PartialResult`; a request that ends with no choice (refused, aborted, failed) gets an
empty result. The engine (engine.py) takes the finished sequences out of flight and returns
these outputs from its `step`.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator

from boardwalk.logs import exception_trace

from .decoding import TextDecoder, held_stop_prefix, text_before_stop
from .sequence import Failed, Request, Sequence
from .types import FINISH_LENGTH, FINISH_STOP, Choice, GenerationResult, PartialResult

logger = logging.getLogger(__name__)


def advance(
    sequences: list[Sequence],
    tokens: list[int | None],
    failed: Failed,
    *,
    eos_token_ids: Collection[int],
    decoder: TextDecoder,
) -> list[Sequence]:
    """Append each sequence's new token; returns those that finished."""
    finished: list[Sequence] = []
    eos, owners = eos_token_ids, failed.owners
    for seq, token in zip(sequences, tokens, strict=True):
        if token is None or (owners and seq.owner in owners):
            continue
        params = seq.owner.spec.params
        if (
            not params.stop
            and (params.ignore_eos or token not in eos)
            and len(seq.tokens) + 1 < params.max_new_tokens
        ):
            seq.tokens.append(token)  # goes on: what `_append` would conclude, cheaper
            continue
        try:
            reason = _append(seq, token, eos_token_ids=eos_token_ids, decoder=decoder)
        except Exception as exc:
            logger.error("a sequence could not be advanced: %s", exception_trace(exc))
            failed.add(seq.owner)
            continue
        if reason is not None:
            finished.append(seq)
    return finished


def _append(
    seq: Sequence, token: int, *, eos_token_ids: Collection[int], decoder: TextDecoder
) -> str | None:
    seq.tokens.append(token)
    params = seq.owner.spec.params
    stopped = token in eos_token_ids and not params.ignore_eos
    text = None
    if not stopped and params.stop:
        text = text_before_stop(decoder, seq.tokens, params.stop)
        stopped = text is not None
    if stopped:
        reason = FINISH_STOP
    elif len(seq.tokens) >= params.max_new_tokens:
        reason = FINISH_LENGTH
    else:
        return None
    if text is None:
        text = decoder.decode(seq.tokens)
    seq.owner.choices[seq.choice] = Choice(
        index=seq.choice,
        token_ids=list(seq.tokens),
        text=text,
        finish_reason=reason,
        logprobs=seq.sampling.logprobs,  # hook (chat surface): recorded by sample()
    )
    return reason


def partials(advanced: list[Sequence], decoder: TextDecoder) -> Iterator[PartialResult]:
    """The new text of the streaming sequences that took a token and go on: decoded
    whole, less a trailing incomplete character and any tail that could begin a stop
    string, so each partial extends the text the result will carry."""
    for seq in advanced:
        request = seq.owner.spec
        if not request.stream:
            continue
        text = decoder.decode(seq.tokens)
        end = len(text.rstrip("\ufffd"))
        end -= held_stop_prefix(text[:end], request.params.stop)
        if end > seq.sent:
            piece, seq.sent = text[seq.sent : end], end
            yield PartialResult(request.id, seq.choice, piece)


def results(finished: list[Sequence]) -> Iterator[GenerationResult]:
    """The results of the requests whose last choice is among `finished` (once each)."""
    for seq in finished:
        owner = seq.owner
        if len(owner.choices) == owner.n and not owner.reported:
            owner.reported = True
            choices = [owner.choices[i] for i in range(owner.n)]
            yield GenerationResult(
                id=owner.spec.id,
                choices=choices,
                prompt_tokens=len(owner.prompt),
                completion_tokens=sum(len(c.token_ids) for c in choices),
                cached_tokens=owner.cached_tokens,
                busy_seconds=owner.busy,
                params=owner.spec.params,  # hook (chat surface): echoed for the body
            )


def empty_result(
    request: Request, *, error: str | None = None, aborted: bool = False
) -> GenerationResult:
    """The result of a request that ends with no choice: refused or failed (`error`), or
    `aborted` (billed for the tokens it had generated)."""
    return GenerationResult(
        id=request.spec.id,
        choices=[],
        prompt_tokens=len(request.prompt),
        completion_tokens=request.generated if aborted else 0,
        cached_tokens=request.cached_tokens,
        busy_seconds=request.busy,
        aborted=aborted,
        error=error,
    )
