"""The engine's request and result types: plain data, no behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from boardwalk.codes import ItemCode

FINISH_STOP = "stop"
FINISH_LENGTH = "length"

ERROR_CONTEXT_LENGTH = ItemCode.CONTEXT_LENGTH_EXCEEDED
ERROR_INVALID_REQUEST = ItemCode.INVALID_REQUEST
# Something failed inside the engine for this request only (its prompt, sampling or decoding
# raised); the other requests in flight were not affected.
ERROR_INTERNAL = ItemCode.INTERNAL_ERROR


@dataclass(frozen=True)
class ConstraintSpec:
    """Output the row must match, as plain data: an llguidance grammar (inference/structured.py
    builds it from `response_format` and `tools`). The engine keeps one matcher per sequence."""

    grammar: str


@dataclass(frozen=True)
class ToolCalls:
    """What the completion needs to read a row's tool calls back, as plain data."""

    names: tuple[str, ...]  # the functions the row's grammar lets it call
    # tool_choice names one function: a completed call ends "stop", as the reference answers
    # (auto and required: "tool_calls").
    named: bool = False


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
    # no API field maps to it. A constrained row may still end once its grammar is complete.
    ignore_eos: bool = False
    logprobs: bool = False  # record each sampled token's log probability
    top_logprobs: int = 0  # and this many most likely alternatives (0-20)
    constraint: ConstraintSpec | None = None
    # Set when the request's tools are enforced and their calls are read back
    # (inference/dialects); echoed to the completion through GenerationResult.params.
    tool_calls: ToolCalls | None = None
    # Echoed too: the prompt already opened the reasoning, so the reply begins inside it
    # (inference/dialects: `Dialect.opened`).
    reasoning_opened: bool = False


@dataclass(frozen=True)
class MediaInput:
    """One image or audio clip of a prompt, already decoded, and where its placeholders are.

    `prompt_ids[start:start + length]` are placeholder tokens; at prefill the engine runs the
    model's encoder on `value` once and feeds its `length` feature vectors in their place.
    """

    modality: str  # "image" | "audio"
    value: Any  # an RGB PIL.Image.Image, or 1-D float32 samples at the feature extractor's rate
    digest: bytes  # a hash of the media's bytes: placeholders alone do not tell images apart
    start: int
    length: int


@dataclass
class GenerationRequest:
    id: str  # opaque, echoed back
    prompt_ids: list[int]
    params: SamplingParams
    # Keys and values computed for one request are reused only by requests of the same scope
    # (the worker sets the organization and deployment), so no tenant can probe another's
    # prompts through cache hits or timing.
    cache_scope: str = ""
    media: list[MediaInput] = field(default_factory=list)  # in prompt order, spans disjoint
    # Higher runs first: interactive requests (1) are admitted ahead of batch rows (0).
    priority: int = 0
    # The caller relays tokens as they come: an engine that can may yield PartialResults.
    stream: bool = False
    # The row's Chat Completions body as the user sent it: an external engine
    # (inference/external/engine.py) posts it to its server, model replaced; Boardwalk's own
    # engine reads prompt_ids and params instead.
    body: dict[str, Any] | None = None
    # Epoch seconds after which the row must never be sent (the batch's expiry); None: none.
    deadline: float | None = None


@dataclass
class TokenLogprob:
    """One sampled token's log probability under the distribution it was drawn from (after
    bias, penalties, the grammar mask and temperature), and the most likely alternatives."""

    token_id: int
    token: bytes  # the token's bytes; a special token is its name in UTF-8
    special: bool  # a special token (end of sequence): not part of the text
    logprob: float
    top: list[tuple[int, bytes, float]]  # (token id, bytes, logprob), most likely first


@dataclass
class Choice:
    index: int
    token_ids: list[int]  # every generated token, the end-of-sequence token included
    # Decoded, special tokens skipped but the dialect's markup (decoding.py), cut before the
    # first stop string.
    text: str
    finish_reason: str  # FINISH_STOP | FINISH_LENGTH
    logprobs: list[TokenLogprob] | None = None  # one per token_ids entry, when asked for


@dataclass
class PartialResult:
    """Text a streaming request's choice produced since its last partial (never final: its
    GenerationResult still follows, with the whole text, usage and busy share)."""

    id: str
    index: int  # the choice
    text: str  # the new text, already cut before any stop string


@dataclass
class GenerationResult:
    id: str
    choices: list[Choice]  # n choices in index order; empty when aborted or in error
    prompt_tokens: int
    completion_tokens: int  # sum over choices
    cached_tokens: int  # prompt tokens whose keys and values were served from the prefix cache
    # This request's share of engine busy time: each forward step's wall time is split equally
    # among the sequences in that step, so the shares of all results add up to the busy time.
    busy_seconds: float
    aborted: bool = False
    error: str | None = None  # ERROR_CONTEXT_LENGTH | ERROR_INVALID_REQUEST | ERROR_INTERNAL
    params: SamplingParams | None = None  # the request's, echoed for the completion body
    # An external engine's answer body, as its server sent it (the recorder builds the row's
    # response from it); None from Boardwalk's own engine.
    response: dict[str, Any] | None = None
