"""Constrained decoding with llguidance: one matcher per sequence, a token mask per step.

The grammar comes as plain data on the request (`SamplingParams.constraint`); a `Constraint`
follows one sequence through it. Before each step `fill` writes the tokens the grammar allows
next into a row of a bitmask (32 tokens a word, a set bit allows); `sampling.sample` turns that
into -inf logits, draws, and calls `advance` with the chosen token. Once the grammar is
complete only end-of-sequence tokens are allowed, so the row stops there.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import llguidance
import llguidance.hf
import torch

from .types import ConstraintSpec

# Bits of one mask word, for unpacking on the logits' device.
_BITS = torch.arange(32, dtype=torch.int32)


class TokenTable:
    """A tokenizer as llguidance sees it, with each token's bytes (for log probabilities)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]) -> None:
        self.vocab_size = vocab_size
        self.eos_ids = frozenset(eos_ids)
        # Every end-of-sequence id the engine stops on counts as the grammar's end.
        self.lltokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=vocab_size, eos_token=sorted(eos_ids) or None
        )
        self._bytes: dict[int, tuple[bytes, bool]] = {}

    def token(self, token_id: int) -> tuple[bytes, bool]:
        """(bytes, is special) of a token; a special token is its name."""
        found = self._bytes.get(token_id)
        if found is None:
            special = self.lltokenizer.is_special_token(token_id)
            found = (self.lltokenizer.decode_bytes([token_id]), special)
            self._bytes[token_id] = found
        return found


@functools.lru_cache(maxsize=8)
def token_table(tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> TokenTable:
    # Building one reads the whole vocabulary (up to a second for large ones): once per engine.
    return TokenTable(tokenizer, vocab_size, eos_ids)


def mask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class GrammarDeadEnd(RuntimeError):
    """A sequence's grammar allows no next token although it is not complete."""

    def __init__(self) -> None:
        super().__init__("the grammar allows no next token")


class Constraint:
    """One sequence's position in its grammar."""

    def __init__(self, spec: ConstraintSpec, table: TokenTable) -> None:
        self.table = table
        self.matcher = llguidance.LLMatcher(table.lltokenizer, spec.grammar, log_level=0)

    @property
    def failed(self) -> bool:
        return self.matcher.is_error()

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (int32 words, CPU).

        Raises GrammarDeadEnd when the grammar has no way on: the row fails (the engine ends it
        with an error) rather than stop with an output its grammar never completed.
        """
        if self.matcher.is_error():
            raise GrammarDeadEnd()
        # What llguidance.torch.fill_next_token_bitmask does; importing that module pulls in
        # torch.compile (seconds, and warnings) for a kernel this engine does not use.
        words = bitmask[row]
        if bitmask.dtype != torch.int32 or not words.is_contiguous() or not bitmask.is_cpu:
            raise ValueError("the bitmask must be a contiguous int32 tensor on the CPU")
        self.matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)
        if self.matcher.is_error():
            # No token continues it (a schema with no finite value the validator missed): the
            # mask would allow only end-of-sequence, and an empty or partial output end "stop".
            raise GrammarDeadEnd()

    def advance(self, token: int) -> None:
        if token in self.table.eos_ids or self.matcher.is_stopped():
            return
        self.matcher.consume_token(token)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int, device: Any) -> torch.Tensor:
    """The boolean [rows, vocab_size] form of a bitmask."""
    words = bitmask.to(device)
    bits = (words[:, :, None] >> _BITS.to(device)) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab_size].bool()
