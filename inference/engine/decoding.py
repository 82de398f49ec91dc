"""Token ids to text, with the markup a model's dialect writes kept in it.

Special tokens are not text: an end-of-sequence token, a chat template's role tokens. Some are
the syntax of a reply, though: GPT-OSS writes its channels with `<|channel|>` and
`<|message|>`, Llama 3.1 begins a call with `<|python_tag|>`, Mistral with `[TOOL_CALLS]`. A
`TextDecoder` skips every special token but those (`keep`), so that the dialect
(inference/dialects) can read the reply's structure back from the text. With nothing to keep it
is exactly `decode(ids, skip_special_tokens=True)`.
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
