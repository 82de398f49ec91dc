"""Prompts longer than the context, found without tokenizing them.

A prompt longer than its revision's context can only end as `context_length_exceeded`, yet
tokenizing it cost about 100 times its size (the Rust tokenizer keeps an alignment per byte
and a record per token): one 20 MiB line took the web tier to 3.5 GB. One token stands for at
most `chars_per_token` characters of the text it encodes, so a rendered prompt longer than
`context_length * chars_per_token` characters holds more than `context_length` tokens, and
nothing more is needed of it: the count records `context_length + 1` (`over_context_count`)
and the prepare stage fails the item `context_length_exceeded`, neither tokenizing it. A
shorter prompt is tokenized as before, so every prompt that fits is counted exactly.

`chars_per_token` is the longest entry of the vocabulary (added tokens included), times what
the normalizer may shrink the text by. It is derived only for tokenizers whose pipeline never
drops or merges characters without bound (BPE covering every byte: byte-level, byte fallback,
or an unfused unknown token; normalizers and pre-tokenizers that keep characters; added
tokens that strip no whitespace); for any other the bound is None and prompts are tokenized in
full, as before.
"""

from __future__ import annotations

import json
import math
import threading
import weakref
from typing import Any

from tokenizers import Tokenizer
from tokenizers.pre_tokenizers import ByteLevel

from inference.chat_completions import prompt_ids
from inference.rendering import template_messages, template_options, text_message
from inference.tokenization import ChatTokenizer

# Normalizers that never make a text shorter, and those that may, by how much at most: NFC
# and NFKC compose up to 4 code points into one (the longest canonical decomposition).
_KEEPING_NORMALIZERS = frozenset({"NFD", "NFKD", "Lowercase", "Prepend", "ByteLevel"})
_COMPOSING_NORMALIZERS = {"NFC": 4, "NFKC": 4}
# Pre-tokenizers that split without removing anything (Split and Punctuation unless their
# behavior is "Removed").
_KEEPING_PRE_TOKENIZERS = frozenset(
    {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "Split", "Punctuation"}
)

_lock = threading.Lock()
_bounds: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()


def chars_per_token(backend: Tokenizer) -> int | None:
    """At most how many characters of a text one token of `backend` stands for; None when
    its pipeline may drop or merge characters without bound (see the module's docstring)."""
    normalizer = _spec(backend.normalizer)
    factor = _normalizer_factor(normalizer)
    pre_tokenizer = _spec(backend.pre_tokenizer)
    model = backend.model
    if factor is None or not _keeps_characters(pre_tokenizer) or type(model).__name__ != "BPE":
        return None
    added = backend.get_added_tokens_decoder().values()
    if any(token.lstrip or token.rstrip for token in added):
        return None  # such a token also takes the whitespace beside it, however long
    vocab = backend.get_vocab(with_added_tokens=True)
    covered = (
        model.byte_fallback
        or (model.unk_token is not None and not model.fuse_unk)
        or (
            (_byte_level(pre_tokenizer) or _byte_level(normalizer))
            and all(c in vocab for c in ByteLevel.alphabet())
        )
    )
    if not covered or not vocab:
        return None  # a character outside the vocabulary could leave no token at all
    return factor * max(len(token) for token in vocab)


def _spec(component: Any) -> dict[str, Any] | None:
    """A normalizer's or pre-tokenizer's own JSON (small: never the vocabulary)."""
    return None if component is None else json.loads(component.__getstate__())


def _normalizer_factor(spec: dict[str, Any] | None) -> int | None:
    """At most how many characters of its input a normalizer turns into one; None: no bound."""
    if spec is None:
        return 1
    kind = spec.get("type")
    if kind == "Sequence":
        factor = 1
        for part in spec.get("normalizers") or []:
            one = _normalizer_factor(part)
            if one is None:
                return None
            factor *= one
        return factor
    if kind in _KEEPING_NORMALIZERS:
        return 1
    if kind in _COMPOSING_NORMALIZERS:
        return _COMPOSING_NORMALIZERS[kind]
    if kind == "Replace":  # a plain string by a non-empty one: it shrinks by their ratio
        pattern, content = spec.get("pattern") or {}, spec.get("content") or ""
        if "String" in pattern and content:
            return max(1, math.ceil(len(pattern["String"]) / len(content)))
    return None  # Strip, StripAccents, Precompiled, BertNormalizer, Nmt, regex Replace, …


def _keeps_characters(spec: dict[str, Any] | None) -> bool:
    """Whether a pre-tokenizer hands on every character of its input."""
    if spec is None:
        return True
    kind = spec.get("type")
    if kind == "Sequence":
        return all(_keeps_characters(part) for part in spec.get("pretokenizers") or [])
    return kind in _KEEPING_PRE_TOKENIZERS and spec.get("behavior") != "Removed"


def _byte_level(spec: dict[str, Any] | None) -> bool:
    """Whether a normalizer or pre-tokenizer maps the text's bytes to ByteLevel's alphabet."""
    if spec is None:
        return False
    if spec.get("type") == "Sequence":
        parts = spec.get("pretokenizers") or spec.get("normalizers") or []
        return any(_byte_level(part) for part in parts)
    return spec.get("type") == "ByteLevel"


def prompt_char_limit(tokenizer: Any, context_length: int) -> int | None:
    """The most characters a rendered prompt can have and still fit `context_length` tokens
    of `tokenizer` (a ChatTokenizer or a transformers fast tokenizer); None: no bound known.
    Computed once per tokenizer object."""
    with _lock:
        if tokenizer in _bounds:
            per_token = _bounds[tokenizer]
        else:
            backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(
                tokenizer, "backend", None
            )
            per_token = chars_per_token(backend) if isinstance(backend, Tokenizer) else None
            _bounds[tokenizer] = per_token
    return None if per_token is None else per_token * context_length


def rendered_text(tokenizer: Any, body: dict[str, Any]) -> str:
    """The body's text-only prompt as the chat template renders it, ready for the reply (the
    text `render_prompt` tokenizes)."""
    messages = template_messages(tokenizer, [text_message(message) for message in body["messages"]])
    tools = body.get("tools") or None
    options = template_options(tokenizer, body)
    if isinstance(tokenizer, ChatTokenizer):
        return tokenizer.render(messages, tools=tools, **options)
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False, **options
    )
    return str(text)


def over_context(tokenizer: Any, body: dict[str, Any], *, context_length: int) -> bool:
    """Whether the body's prompt surely holds more than `context_length` tokens, found by
    rendering it, without tokenizing. On a revision with media the text-only rendering is
    measured: the prompt with its placeholders holds all of that text, and more."""
    limit = prompt_char_limit(tokenizer, context_length)
    return limit is not None and len(rendered_text(tokenizer, body)) > limit


def bounded_prompt_ids(
    tokenizer: Any, body: dict[str, Any], *, context_length: int
) -> list[int] | None:
    """The text-only prompt's token ids (those of `prompt_ids`), or None when the prompt
    surely holds more than `context_length` tokens: then it is rendered, never tokenized."""
    text = rendered_text(tokenizer, body)
    limit = prompt_char_limit(tokenizer, context_length)
    if limit is not None and len(text) > limit:
        return None
    if isinstance(tokenizer, ChatTokenizer):
        return list(tokenizer.backend.encode(text, add_special_tokens=False).ids)
    # What apply_chat_template(tokenize=True) does with the text it renders.
    return [int(token) for token in tokenizer(text, add_special_tokens=False)["input_ids"]]


def prompt_token_counts(tokenizer: Any, bodies: list[dict[str, Any]]) -> list[int]:
    """`len(prompt_ids(tokenizer, body))` of each body, or `over_context_count`
    (`context_length + 1`) for a prompt that surely holds more than the context of the
    ChatTokenizer's revision, found without tokenizing it. Text-only prompts on a
    ChatTokenizer are encoded in one batch (`count_rendered`), the rest one by one; a
    tokenizer that carries no `context_length` counts every prompt in full."""
    context_length = getattr(tokenizer, "context_length", None)
    limit = prompt_char_limit(tokenizer, context_length) if context_length else None
    over = over_context_count(context_length or 0)
    if getattr(tokenizer, "media_layout", True) is not None:  # media, or not a ChatTokenizer
        return [
            over
            if limit is not None and len(rendered_text(tokenizer, body)) > limit
            else len(prompt_ids(tokenizer, body))
            for body in bodies
        ]
    texts: list[str | None] = []
    for body in bodies:
        text = rendered_text(tokenizer, body)
        # An over-long text is dropped at once: a chunk holds one such text at a time.
        texts.append(None if limit is not None and len(text) > limit else text)
    counted = iter(tokenizer.count_rendered([text for text in texts if text is not None]))
    return [over if text is None else next(counted) for text in texts]


def over_context_count(context_length: int) -> int:
    """The count recorded for a prompt found longer than the context without tokenizing it:
    one token more than fits (its acceptance hold counts that many; it is never charged)."""
    return context_length + 1
