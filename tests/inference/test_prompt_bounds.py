"""Prompts surely longer than the context, found without tokenizing:
inference.prompt_bounds. A rendered prompt of more than context_length * chars_per_token
characters holds more than context_length tokens; every shorter one is counted exactly."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

from inference.chat_completions import prompt_ids
from inference.prompt_bounds import (
    bounded_prompt_ids,
    chars_per_token,
    over_context,
    prompt_char_limit,
    prompt_token_counts,
    rendered_text,
)
from inference.tokenization import ChatTokenizer, chat_tokenizer_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def web(catalog_model: Any) -> ChatTokenizer:
    return chat_tokenizer_for(catalog_model.revision)


def _body(content: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_completion_tokens": 8}


def _tokens(backend: Tokenizer, text: str) -> int:
    return len(backend.encode(text, add_special_tokens=False).ids)


def test_the_demo_tokenizer_bound_is_its_longest_vocabulary_entry(web: ChatTokenizer) -> None:
    vocab = web.backend.get_vocab(with_added_tokens=True)
    assert chars_per_token(web.backend) == max(map(len, vocab)) == len("<|endoftext|>")
    # The bound is reached: a text made of the longest token has exactly that many per token.
    assert _tokens(web.backend, "<|endoftext|>" * 50) == 50


def test_no_text_has_more_characters_per_token_than_the_bound(web: ChatTokenizer) -> None:
    bound = chars_per_token(web.backend)
    assert bound is not None
    rng = random.Random(29)  # noqa: S311 - test texts, not secrets
    vocab = list(web.backend.get_vocab(with_added_tokens=True))
    alphabet = "ab z\n\t.,é漢😀\u0301<|>" + "".join(
        chr(rng.randrange(32, 0x3000)) for _ in range(64)
    )
    texts = [
        " " * 5000,  # runs the pre-tokenizer keeps whole
        "a" * 5000,
        "\n" * 5000,
        "".join(rng.choice(vocab) for _ in range(2000)),  # vocabulary entries back to back
        " ".join(rng.choice(vocab) for _ in range(2000)),
        *("".join(rng.choice(alphabet) for _ in range(3000)) for _ in range(5)),
    ]
    for text in texts:
        assert len(text) <= bound * _tokens(web.backend, text), text[:40]


def _bpe(**options: Any) -> Tokenizer:
    vocab = {"a": 0, "b": 1, "ab": 2, "<unk>": 3}
    return Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], **options))


def test_tokenizers_that_may_drop_or_merge_characters_have_no_bound() -> None:
    assert chars_per_token(_bpe(unk_token="<unk>", fuse_unk=False)) == 5  # "<unk>"
    assert chars_per_token(_bpe(byte_fallback=True)) == 5
    # An unknown character with no unknown token leaves no token at all; a fused unknown
    # token stands for a run of them, however long.
    assert chars_per_token(_bpe()) is None
    assert chars_per_token(_bpe(unk_token="<unk>", fuse_unk=True)) is None

    removing = _bpe(unk_token="<unk>")
    removing.pre_tokenizer = pre_tokenizers.Whitespace()  # drops whitespace
    assert chars_per_token(removing) is None
    stripping = _bpe(unk_token="<unk>")
    stripping.normalizer = normalizers.Strip()
    assert chars_per_token(stripping) is None
    absorbing = _bpe(unk_token="<unk>")
    absorbing.add_special_tokens([AddedToken("<|end|>", rstrip=True)])  # eats the spaces after
    assert chars_per_token(absorbing) is None
    assert chars_per_token(Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, "<unk>"))) is None


def test_a_normalizer_that_composes_characters_widens_the_bound() -> None:
    composing = _bpe(unk_token="<unk>")
    composing.normalizer = normalizers.NFC()  # up to 4 code points become one
    assert chars_per_token(composing) == 4 * 5
    spaces = _bpe(unk_token="<unk>")
    spaces.normalizer = normalizers.Sequence(
        [normalizers.Replace("  ", " "), normalizers.Prepend("▁")]
    )
    assert chars_per_token(spaces) == 2 * 5
    kept = _bpe(unk_token="<unk>")
    kept.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(" ", behavior="isolated"), pre_tokenizers.Digits()]
    )
    assert chars_per_token(kept) == 5
    kept.pre_tokenizer = pre_tokenizers.Split(" ", behavior="removed")
    assert chars_per_token(kept) is None


def _at_length(tokenizer: Any, length: int) -> dict[str, Any]:
    """A body whose rendered prompt is exactly `length` characters."""
    overhead = len(rendered_text(tokenizer, _body("")))
    return _body(("word " * length)[: length - overhead])


def test_prompts_up_to_the_limit_are_counted_exactly_and_longer_ones_as_one_over(
    web: ChatTokenizer, catalog_model: Any
) -> None:
    from inference.runtime import tokenizer_for

    context = catalog_model.revision.context_length
    limit = prompt_char_limit(web, context)
    assert limit == 13 * context
    worker = tokenizer_for(catalog_model.revision)
    assert prompt_char_limit(worker, context) == limit  # the same tokenizer.json

    at_limit, over = _at_length(web, limit), _at_length(web, limit + 1)
    assert len(rendered_text(worker, at_limit)) == limit
    exact = len(prompt_ids(web, at_limit))
    assert exact > context  # longer than the context, yet within the limit: counted in full
    small = _body("Hello there")
    counts = prompt_token_counts(web, [small, at_limit, over, small])
    assert counts == [len(prompt_ids(web, small)), exact, context + 1, len(prompt_ids(web, small))]

    # The prepare stage: the same ids as the template's within the limit, None past it.
    assert bounded_prompt_ids(worker, at_limit, context_length=context) == prompt_ids(
        worker, at_limit
    )
    assert bounded_prompt_ids(worker, over, context_length=context) is None
    assert over_context(worker, over, context_length=context)
    assert not over_context(worker, at_limit, context_length=context)


def test_a_tokenizer_without_a_known_bound_counts_every_prompt_in_full(
    web: ChatTokenizer, catalog_model: Any
) -> None:
    context = catalog_model.revision.context_length
    unbounded = ChatTokenizer(Path(catalog_model.revision.weights))
    assert unbounded.context_length is None  # not told its context: nothing to stop at
    over = _at_length(web, 13 * context + 1)
    assert prompt_token_counts(unbounded, [over]) == [len(prompt_ids(web, over))]
