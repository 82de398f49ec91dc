"""How an engine runs: the plain values an `Engine` is built with, as nano-vllm's `Config`.

What the engine is given besides them are live objects (the model, its tokenizer and
processor, a tensor-parallel rank's check on the others), which stay arguments of `Engine`.
An `EngineConfig` is frozen and picklable: the worker builds it from its settings
(inference/runtime.py) and it crosses to the engine's child process (process.py), which is
started with `spawn`; tensor-parallel ranks derive theirs with `dataclasses.replace`
(lockstep.py). Plain standard library: the worker's side imports it without torch.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

# The step time kept while interactive requests are in flight (BOARDWALK_INTERACTIVE_STEP_MS).
DEFAULT_INTERACTIVE_STEP_SECONDS = 0.075


@dataclass(frozen=True)
class EngineConfig:
    """The engine's tuning; every field but `context_length` has the engine's default."""

    context_length: int
    """The most tokens a sequence holds, prompt and generated together."""
    max_batch_size: int = 32
    """The most sequences in flight at once (the engine's rows)."""
    eos_token_ids: Collection[int] | None = None
    """The ids that end a sequence; None: the model's and tokenizer's own."""
    abort_poll_seconds: float = 0.5
    """How often, in seconds of work, aborts are polled (0: every step, and no decoding runs)."""
    max_step_tokens: int | None = None
    """A step's token budget; None: 2048 on CUDA, else 512 (never below `max_batch_size`)."""
    block_size: int = 16
    """Token slots in one key/value block (kv.py)."""
    kv_cache_bytes: int | None = None
    """The key/value pool's size in bytes; None: sized from the device (runner.py)."""
    max_num_blocks: int | None = None
    """The key/value pool's size in blocks; wins over `kv_cache_bytes`."""
    prefix_cache: bool = True
    """Keep finished requests' full blocks for later prompts with the same prefix."""
    interactive_step_seconds: float = DEFAULT_INTERACTIVE_STEP_SECONDS
    """The step time kept while interactive requests are in flight (pacing.py; 0: off)."""
    cuda_graphs: bool | None = None
    """Capture decoding steps (graphs.py; None: on), only ever on CUDA."""
    markup_tokens: Collection[str] = ()
    """Special tokens of the revision's dialect, kept in the decoded text (decoding.py)."""
    turn_end_tokens: Collection[str] = ()
    """The dialect's tokens that end a reply, beside the end-of-sequence ids."""

    def __post_init__(self) -> None:
        # Collections as values: a caller's set or list changed later changes nothing here.
        if self.eos_token_ids is not None:
            object.__setattr__(self, "eos_token_ids", frozenset(self.eos_token_ids))
        object.__setattr__(self, "markup_tokens", tuple(self.markup_tokens))
        object.__setattr__(self, "turn_end_tokens", tuple(self.turn_end_tokens))
        for name in ("context_length", "max_batch_size", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("max_step_tokens", "kv_cache_bytes", "max_num_blocks"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 where given")
        for name in ("abort_poll_seconds", "interactive_step_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
