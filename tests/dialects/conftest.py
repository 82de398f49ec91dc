"""Real tokenizers and chat templates of each family, and helpers to read replies back.

`family_tokenizer("qwen3")` is the family's real tokenizer with its real chat template
(fetched from the package registries by the test set-up: tests/formats).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import llguidance
import llguidance.hf
import pytest
from transformers import AutoTokenizer

from inference.dialects import Dialect, Marks
from inference.engine.decoding import TextDecoder


@functools.cache
def load_family(name: str) -> Any:
    from tests.formats.families import family_dir

    return AutoTokenizer.from_pretrained(str(family_dir(name)), local_files_only=True)


@pytest.fixture
def family_tokenizer() -> Callable[[str], Any]:
    return load_family


def as_generated(tokenizer: Any, dialect: Dialect, reply: str) -> str:
    """`reply` (a real-format reply, markup included) as the engine hands it to the dialect:
    tokenized by the real tokenizer, decoded with the dialect's markup kept."""
    ids = tokenizer.encode(reply, add_special_tokens=False)
    return TextDecoder(tokenizer, dialect.markup).decode(ids)


def marks_for(tokenizer: Any, dialect: Dialect) -> Marks:
    """The marks the engine writes a revision's grammars with (inference/chat_completions.py)."""
    return Marks.in_vocabulary(tokenizer.get_vocab(), dialect.markers)


@functools.cache
def _lltokenizer(tokenizer: Any) -> Any:
    # Seconds for a 200k vocabulary: once per tokenizer.
    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))


def grammar_accepts(tokenizer: Any, grammar: str, reply: str, *, complete: bool = True) -> bool:
    """Whether the grammar lets the real tokenizer's tokens of `reply` through (and, with
    `complete`, lets the reply end there)."""
    lltokenizer = _lltokenizer(tokenizer)
    matcher = llguidance.LLMatcher(lltokenizer, grammar, log_level=0)
    for token in tokenizer.encode(reply, add_special_tokens=False):
        if not matcher.consume_token(token):
            return False
    return matcher.is_accepting() if complete else not matcher.is_error()
