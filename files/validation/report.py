"""What the validator is given (a model resolver) and what it answers (a report)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelTarget:
    """The model a file's `body.model` resolves to, as far as validation needs it."""

    name: str
    context_length: int  # max tokens of the revision
    media: frozenset[str]  # modalities accepted in batch besides text: subset of {"image", "audio"}
    # How the revision writes reasoning and tool calls (inference/dialects): whether it takes
    # `tools` and which `reasoning_effort` values.
    dialect: str = "plain"


class ModelLookupError(Exception):
    """Raised by a resolver; `code` becomes the line error's code, `message` its message.

    The message must be safe to show the uploader (it names the model, never content).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# Called at most once per distinct model name; raises ModelLookupError.
Resolver = Callable[[str], ModelTarget]


@dataclass(frozen=True)
class LineError:
    """One upload error. `message` never quotes content from the line
    (docs/API.md "Limits, retention and privacy")."""

    line: int  # 1-based; 0 for the whole file (empty file)
    field: str  # dotted path such as "body.messages[0].content"; "" for the whole line
    code: str
    message: str


@dataclass(frozen=True)
class LineInfo:
    """Where a valid line lies in the file, and what it asks for."""

    offset: int  # byte offset of the line start
    length: int  # bytes of the line, without its "\n" or "\r\n"
    custom_id: str
    max_tokens: int  # effective max output tokens
    n: int  # choices per request
    # Sectioned files: where the request's section line lies (its shared body and prefix).
    section_offset: int | None = None
    section_length: int = 0


@dataclass
class ValidationReport:
    errors: list[LineError]  # the first `max_errors`, in line order
    error_count: int  # all errors, including those beyond `errors`
    lines: list[LineInfo]  # one per valid line, in order
    model: str | None  # the common body.model
    total_bytes: int
    format: str | None = None  # None: standard; "sectioned.v1": BatchRouter sectioned JSONL

    @property
    def ok(self) -> bool:
        return self.error_count == 0
