"""The state of the work in flight: a request, and one sequence per choice it generates.

Plain state, no behaviour beyond reading itself: the scheduler decides what a sequence computes
next, the block manager (blocks.py) alone fills and empties its block table, and the engine
appends its tokens and reports its request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sampling import RowSampling
from .types import Choice, GenerationRequest


@dataclass(eq=False)
class Request:
    """A request in flight or waiting: what was asked (`spec`) and what the engine holds
    for it (its choices so far, busy share, parked sequences)."""

    spec: GenerationRequest
    order: int = 0  # admission order in this `generate` call: older requests go first
    choices: dict[int, Choice] = field(default_factory=dict)
    busy: float = 0.0
    cached_tokens: int = 0
    forked: bool = False  # its other choices exist (from the start when n is 1)
    reported: bool = False
    features: dict[int, torch.Tensor] = field(default_factory=dict)  # media index → encoded
    # Its sequences while an interactive request holds its rows: blocks given back, tokens
    # and sampling state kept, computed again once it is admitted again.
    parked: list[Sequence] = field(default_factory=list)
    # Tokens its choices had generated when it was aborted: what a cut request is billed for.
    generated: int = 0

    def __post_init__(self) -> None:
        self.forked = self.forked or self.spec.params.n == 1  # one choice: nothing to fork

    @property
    def prompt(self) -> list[int]:
        return self.spec.prompt_ids

    @property
    def n(self) -> int:
        return self.spec.params.n

    @property
    def priority(self) -> int:
        return self.spec.priority


@dataclass(eq=False)
class Sequence:
    owner: Request
    choice: int
    sampling: RowSampling
    tokens: list[int] = field(default_factory=list)  # generated so far
    blocks: list[int] = field(default_factory=list)  # the block table
    # Its leading blocks given back because no layer's window reaches them any more (their
    # entries read block 0, blocks.py `slide`).
    slid: int = 0
    digests: list[bytes] = field(default_factory=list)  # of the full blocks, in order
    prompt_digests: list[bytes] = field(default_factory=list)  # of the prompt's full blocks
    computed: int = 0  # leading tokens of prompt + generated whose keys/values are stored
    preempted: bool = False  # its own blocks, found again in the cache, are not a cache hit
    sent: int = 0  # characters of its text already yielded as partials (streaming requests)
    # Whether it may decode in runs of steps planned at once (runs.py): a batch text row
    # without stop strings or streaming whose sampling needs nothing per step but its draws.
    runs_ahead: bool = False
    prompt_length: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.prompt_length = len(self.owner.spec.prompt_ids)

    @property
    def length(self) -> int:
        return self.prompt_length + len(self.tokens)

    def token_at(self, index: int) -> int:
        """Token `index` of prompt + generated."""
        p = self.prompt_length
        return self.owner.spec.prompt_ids[index] if index < p else self.tokens[index - p]

    def span(self, lo: int, hi: int) -> list[int]:
        """Tokens [lo, hi) of prompt + generated, without building the whole list."""
        prompt = self.owner.prompt
        p = len(prompt)
        if hi <= p:
            return prompt[lo:hi]
        head = prompt[lo:] if lo < p else []
        return head + self.tokens[max(lo - p, 0) : hi - p]


# What a step schedules: a sequence and how many of its next tokens to compute.
Work = list[tuple[Sequence, int]]


@dataclass
class Failed:
    """The requests whose own work raised during one step, in the order they failed."""

    owners: list[Request] = field(default_factory=list)

    def add(self, owner: Request) -> None:
        if owner not in self.owners:
            self.owners.append(owner)


def age(seq: Sequence) -> tuple[int, int, int]:
    """Sorts interactive sequences before batch ones, then oldest first."""
    return -seq.owner.priority, seq.owner.order, seq.choice


def rows_held(running: list[Sequence]) -> int:
    """Rows held by the requests in flight: n each, forked or not yet."""
    owners = {id(s.owner): s.owner.n for s in running}
    return sum(owners.values())
