"""Counting prompt tokens in the web tier: `tokenizers` + the chat template, no torch.

The web process never imports torch or transformers model code (importing transformers'
AutoTokenizer alone pulls torch in). `ChatTokenizer` reads the revision's `tokenizer.json`
and `tokenizer_config.json` and renders the chat template the way transformers'
`apply_chat_template` does (a sandboxed Jinja environment, trim_blocks/lstrip_blocks, the
special tokens as variables, then encoding without added special tokens), so
`inference.chat_completions.prompt_ids` gives the worker's counts. Files are counted with
`inference.prompt_bounds.prompt_token_counts`, which stops at the revision's context.

Every prompt passes through `ChatTokenizer.render` (uploads, interactive requests) before a
worker renders it, so the bounds live there: a template is an operator's file and may loop
for minutes or build huge strings. A render stops with `RenderLimitExceeded` past
`RENDER_SECONDS`, past `RENDER_STEPS` iterations of `range()`, or when its output or one
repetition (`'x' * n`) outgrows the input by more than `RENDER_GROWTH` times (plus 1 MiB);
`manage.py model inspect` renders a probe conversation under the same bounds.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range
from tokenizers import Tokenizer

from inference.dialects import DIALECTS, Dialect
from inference.media_layout import LayoutUnavailable, MediaLayout, media_layout
from inference.models import ModelRevision

_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")
_lock = threading.Lock()
_cache: OrderedDict[str, ChatTokenizer] = OrderedDict()


RENDER_SECONDS = 2.0
RENDER_STEPS = 1_000_000
RENDER_GROWTH = 8
_SLACK_CHARS = 1 << 20


class TokenizerUnavailable(Exception):
    """The revision's tokenizer files cannot be found or read."""


class RenderLimitExceeded(TemplateError):
    """The chat template ran past a bound of `ChatTokenizer.render` (module doc)."""


def _raise(message: str) -> None:
    raise TemplateError(message)


class _Budget:
    """What one render may still spend; checked at each range step, repetition and piece of
    output (a Jinja render cannot be interrupted from outside)."""

    def __init__(self, chars: int) -> None:
        self.deadline = time.monotonic() + RENDER_SECONDS
        self.steps = RENDER_STEPS
        self.chars = chars

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise RenderLimitExceeded(
                f"the chat template looped more than {RENDER_STEPS} times rendering one prompt"
            )
        if self.steps % 1024 == 0:
            self.clock()

    def clock(self) -> None:
        if time.monotonic() > self.deadline:
            raise RenderLimitExceeded(
                f"the chat template took more than {RENDER_SECONDS:g} s to render one prompt"
            )

    def size(self, chars: int) -> None:
        if chars > self.chars:
            raise RenderLimitExceeded(
                f"the chat template produced more than {self.chars} characters for one prompt "
                f"({RENDER_GROWTH} times its input, plus 1 MiB)"
            )


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("budget", default=None)


def _spend() -> _Budget:
    # Outside ChatTokenizer.render (never, today): each call bounded on its own.
    return _budget.get() or _Budget(_SLACK_CHARS)


class _BoundedRange:
    """`range()` in a template: the same numbers, each step counted against the budget."""

    def __init__(self, *args: int) -> None:
        self._range = safe_range(*args)  # jinja's own cap of 100,000 items per range

    def __iter__(self) -> Iterator[int]:
        budget = _spend()
        for value in self._range:
            budget.step()
            yield value

    def __reversed__(self) -> Iterator[int]:
        budget = _spend()
        for value in reversed(self._range):
            budget.step()
            yield value

    def __len__(self) -> int:
        return len(self._range)

    def __getitem__(self, index: Any) -> Any:
        return self._range[index]

    def __contains__(self, value: object) -> bool:
        return value in self._range


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with repetition (`*`) and powers (`**`) bounded."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            if isinstance(right, int) and abs(right) > 256:
                raise RenderLimitExceeded("the chat template raised a number to a huge power")
            return left**right
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(times, int):
                _spend().size(len(seq) * times)
        return left * right


class ChatTokenizer:
    """The subset of a transformers tokenizer that prompt rendering needs."""

    def __init__(
        self,
        directory: Path,
        *,
        chat_template: str | None = None,
        media_layout: MediaLayout | None = None,
        context_length: int | None = None,
        dialect: Dialect | None = None,
    ) -> None:
        try:
            self.backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
            config: dict[str, Any] = {}
            if (directory / "tokenizer_config.json").exists():
                config = json.loads((directory / "tokenizer_config.json").read_text())
        except (OSError, ValueError, Exception) as exc:
            raise TokenizerUnavailable(f"cannot read the tokenizer in {directory}") from exc
        template = chat_template or config.get("chat_template")
        if not template and (directory / "chat_template.jinja").exists():
            template = (directory / "chat_template.jinja").read_text()
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if not template:
            raise TokenizerUnavailable(f"the tokenizer in {directory} has no chat template")
        self.chat_template = template
        self.special = {name: _token_text(config.get(name)) for name in _SPECIAL}
        env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.globals["raise_exception"] = _raise
        env.globals["range"] = _BoundedRange
        # transformers' own global: GPT-OSS, Llama 3.2 and Mistral Small 3.2 date the system
        # prompt with it (without it those templates fail, and every count with them).
        env.globals["strftime_now"] = _strftime_now
        # transformers' own filter: plain JSON (jinja2's built-in one escapes HTML characters,
        # which would count different tokens than the worker renders).
        env.filters["tojson"] = _tojson
        self._template = env.from_string(template)
        # Where media goes in this revision's prompts (None: text only); read by prompt_ids.
        self.media_layout = media_layout
        # The revision's context: counting stops at a prompt surely longer than it
        # (inference.prompt_bounds); None counts every prompt in full.
        self.context_length = context_length
        # How the revision's template takes reasoning_effort and earlier reasoning
        # (inference.rendering.template_options); None: as the template is.
        self.dialect = dialect

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        tokenize: bool = True,
        return_dict: bool = False,
        **options: Any,
    ) -> list[int]:
        text = self.render(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, **options
        )
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **options: Any,
    ) -> str:
        """The prompt's text; RenderLimitExceeded when the template runs past the module's
        bounds (the output may grow to RENDER_GROWTH times the messages and tools as JSON).
        `options`: template variables the dialect sets (`reasoning_effort`, thinking)."""
        given = len(json.dumps([messages, tools], ensure_ascii=False, default=str))
        budget = _Budget(RENDER_GROWTH * given + _SLACK_CHARS)
        token = _budget.set(budget)
        try:
            pieces, length = [], 0
            for piece in self._template.generate(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                **{**self.special, **options},
            ):
                length += len(piece)
                budget.size(length)
                budget.clock()
                pieces.append(piece)
            return "".join(pieces)
        finally:
            _budget.reset(token)

    def count_rendered(self, texts: list[str]) -> list[int]:
        """Token counts of rendered prompts, encoded in one call: the Rust tokenizer spreads
        it over the cores and releases the interpreter lock meanwhile. The fast variant
        skips the character offsets a count does not need (256 prompts: 22 → 15 ms); the
        ids are the same as `encode`'s."""
        encoded = self.backend.encode_batch_fast(texts, add_special_tokens=False)
        return [len(e.ids) for e in encoded]


def _strftime_now(format: str) -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime(str(format)[:64])


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _directory(revision: ModelRevision, source: str | None = None) -> Path:
    source = source or revision.tokenizer or revision.weights
    path = Path(source)
    if path.is_dir():
        return path
    # A hub id: its files must already be in the local cache (nothing downloads).
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                source, revision=revision.weights_revision or None, local_files_only=True
            )
        )
    except Exception as exc:
        raise TokenizerUnavailable(f"tokenizer of {revision.id} is not available locally") from exc


def chat_tokenizer_for(revision: ModelRevision) -> ChatTokenizer:
    """The revision's tokenizer for counting (cached per process, a few revisions)."""
    with _lock:
        cached = _cache.get(revision.id)
        if cached is not None:
            _cache.move_to_end(revision.id)
            return cached
    tokenizer = ChatTokenizer(
        _directory(revision),
        chat_template=revision.chat_template or None,
        media_layout=media_layout_for(revision),
        context_length=revision.context_length,
        dialect=DIALECTS.get(revision.dialect),
    )
    with _lock:
        _cache[revision.id] = tokenizer
        while len(_cache) > 8:
            _cache.popitem(last=False)
    return tokenizer


_layouts: dict[str, MediaLayout | None] = {}


def media_layout_for(revision: ModelRevision) -> MediaLayout | None:
    """Where media goes in `revision`'s prompts; None for a text-only architecture or one
    whose files cannot be read. Revisions are immutable, so the answer is kept per process."""
    if revision.id in _layouts:
        return _layouts[revision.id]
    try:
        layout = media_layout(_directory(revision, revision.weights))
    except (LayoutUnavailable, TokenizerUnavailable):
        layout = None
    with _lock:
        _layouts[revision.id] = layout
    return layout


def runnable_media_for(revision: ModelRevision) -> frozenset[str]:
    """The modalities beyond text that the engine can run for `revision`: those its
    architecture has an encoder and a processor for (inference/media_layout.py)."""
    layout = media_layout_for(revision)
    return frozenset({layout.modality} if layout else ())
