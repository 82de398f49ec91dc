"""The engine's request and result types: plain data, no behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field

FINISH_STOP = "stop"
FINISH_LENGTH = "length"

ERROR_CONTEXT_LENGTH = "context_length_exceeded"
ERROR_INVALID_REQUEST = "invalid_request"


@dataclass
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    # Generate exactly max_new_tokens, ignoring end-of-sequence tokens. For benchmarks and tests;
    # no API field maps to it.
    ignore_eos: bool = False


@dataclass
class GenerationRequest:
    id: str  # opaque, echoed back
    prompt_ids: list[int]
    params: SamplingParams
    # Prefix reuse happens only between requests with equal cache_scope (one organization,
    # plus the deployment for private batches): cached tokens never cross tenants.
    cache_scope: str = ""


@dataclass
class Choice:
    index: int
    token_ids: list[int]  # every generated token, the end-of-sequence token included
    text: str  # decoded, special tokens skipped, cut before the first stop string
    finish_reason: str  # FINISH_STOP | FINISH_LENGTH


@dataclass
class GenerationResult:
    id: str
    choices: list[Choice]  # n choices in index order; empty when aborted or in error
    prompt_tokens: int
    completion_tokens: int  # sum over choices
    cached_tokens: int  # prompt tokens whose keys and values were reused from another request
    # This request's share of engine busy time: each forward step's wall time is split equally
    # among the sequences in that step, so the shares of all results add up to the busy time.
    busy_seconds: float
    aborted: bool = False
    error: str | None = None  # ERROR_CONTEXT_LENGTH | ERROR_INVALID_REQUEST
