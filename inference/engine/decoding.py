"""Token ids to text, with the markup a model's dialect writes kept in it.

Special tokens are not text: an end-of-sequence token, a chat template's role tokens. Some are
the syntax of a reply, though: GPT-OSS writes its channels with `<|channel|>` and
`<|message|>`, Llama 3.1 begins a call with `<|python_tag|>`, Mistral with `[TOOL_CALLS]`. A
`TextDecoder` skips every special token but those (`keep`), so that the dialect
(inference/dialects) can read the reply's structure back from the text. With nothing to keep it
is exactly `decode(ids, skip_special_tokens=True)`.

Stop strings are cut from that text: `text_before_stop` ends a sequence's text at the first stop
string its newest token completed, and `held_stop_prefix` says how much of a streamed text's
tail could still begin one (it is held back until the next tokens tell).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


class TextDecoder:
    def __init__(self, tokenizer: Any, keep: Collection[str] = ()) -> None:
        self.tokenizer = tokenizer
        kept = token_ids(tokenizer, keep)
        self.kept_ids = frozenset(kept)
        special: set[int] = set(getattr(tokenizer, "all_special_ids", ()) or ())
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        special.update(int(i) for i, token in added.items() if getattr(token, "special", False))
        self._hidden = frozenset(special - kept)

    def decode(self, ids: list[int]) -> str:
        if not self.kept_ids:
            return self.tokenizer.decode(list(ids), skip_special_tokens=True)
        shown = [i for i in ids if i not in self._hidden]
        return self.tokenizer.decode(shown, skip_special_tokens=False)


def token_ids(tokenizer: Any, names: Collection[str]) -> set[int]:
    """The ids of those of `names` that are single tokens of the vocabulary."""
    if not names:
        return set()
    vocab = tokenizer.get_vocab()
    return {int(vocab[name]) for name in names if name in vocab}


def text_before_stop(decoder: TextDecoder, tokens: list[int], stops: tuple[str, ...]) -> str | None:
    """The text of `tokens` cut before the first stop string, if the last token completed one;
    None if it completed none."""
    # A token is at least one byte and a character at most four, so this many tail tokens
    # hold any stop string that the newest token could have completed.
    tail = 4 * max(len(s) for s in stops) + 4
    recent = decoder.decode(tokens[-tail:])
    if not any(s in recent for s in stops):
        return None
    text = decoder.decode(tokens)
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[: min(cuts)] if cuts else None


def held_stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that begins one of the stop strings: it may yet
    be cut, so it is not streamed until the next tokens tell."""
    held = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:k]):
                held = k
                break
    return held
