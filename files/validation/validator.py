"""The streaming validator for standard batch input files (SPEC §4.1)."""

from __future__ import annotations

import re

import orjson

from . import rules
from .lines import Line, LineSplitter
from .report import (
    LineError,
    LineInfo,
    ModelLookupError,
    ModelTarget,
    Resolver,
    ValidationReport,
)
from .shape import MAX_LINE_VALUES, duplicate_key_field, has_duplicate_keys, too_many_values

_UTF8_BOM = b"\xef\xbb\xbf"

# A model name is shown back in messages only when it looks like one.
_PLAIN_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@\-]{0,127}")


class InputValidator:
    """Validate a batch input file fed in chunks of any size.

    Holds at most one line (up to `max_line_bytes`) besides the chunk being fed, so a 256 MiB
    upload is checked as it streams in. Lines past `max_lines` are counted, not checked.
    """

    def __init__(
        self,
        resolve: Resolver,
        *,
        max_lines: int = 1000,
        max_line_bytes: int = 20 * 1024 * 1024,
        max_errors: int = 100,
    ) -> None:
        if max_lines < 1:
            raise ValueError("max_lines must be at least 1")
        self._resolve = resolve
        self._max_lines = max_lines
        self._max_line_bytes = max_line_bytes
        self._max_errors = max_errors
        self._splitter = LineSplitter(max_line_bytes)
        self._errors: list[LineError] = []
        self._error_count = 0
        self._lines: list[LineInfo] = []
        self._custom_ids: dict[str, int] = {}
        self._model: str | None = None
        self._model_line = 0
        self._target: ModelTarget | None = None
        self._finished = False

    @property
    def buffered_bytes(self) -> int:
        """Bytes of a partial line held between chunks."""
        return self._splitter.buffered_bytes

    def feed(self, data: bytes) -> None:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        for line in self._splitter.feed(data):
            self._check_line(line)
            if line.number >= self._max_lines:
                self._splitter.count_only()

    def finish(self) -> ValidationReport:
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        last = self._splitter.finish()
        if last is not None and last.number <= self._max_lines:
            self._check_line(last)
        count = self._splitter.line_count
        if count == 0:
            self._error(0, "", "empty_file", "The file is empty; add at least one request line")
        elif count > self._max_lines:
            self._error(
                self._max_lines + 1,
                "",
                "too_many_lines",
                f"Line {self._max_lines + 1}: the file has {count} lines; at most "
                f"{self._max_lines} are allowed, so split it into several files",
            )
        return ValidationReport(
            errors=self._errors,
            error_count=self._error_count,
            lines=self._lines,
            model=self._model,
            total_bytes=self._splitter.total_bytes,
        )

    def _error(self, line: int, field: str, code: str, message: str) -> None:
        self._error_count += 1
        if len(self._errors) < self._max_errors:
            self._errors.append(LineError(line=line, field=field, code=code, message=message))

    def _check_line(self, line: Line) -> None:
        number = line.number
        if line.data is None:
            self._error(
                number,
                "",
                "line_too_large",
                f"Line {number}: the line is {line.length} bytes; a line may hold at most "
                f"{self._max_line_bytes} bytes",
            )
            return
        if line.length == 0:
            self._error(number, "", "blank_line", f"Line {number}: remove the blank line")
            return
        data = line.data
        # A line within one read is a view of it; a copy of at most a read lets bytes methods run.
        text = data if isinstance(data, bytearray) else bytes(data)
        if too_many_values(text):
            self._error(
                number,
                "",
                "too_many_values",
                f"Line {number}: the line holds more than {MAX_LINE_VALUES} JSON values; a "
                "request needs far fewer",
            )
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            self._parse_error(number, line.offset, data, exc)
            return
        if type(obj) is not dict:
            self._error(
                number, "", "not_an_object", f"Line {number}: the line must be a JSON object"
            )
            return
        if has_duplicate_keys(text, obj):
            # orjson keeps the last of duplicate keys; which one a client meant is unknowable.
            field = duplicate_key_field(text)
            shown = field or "a key"
            self._error(
                number,
                field,
                "duplicate_key",
                f"Line {number}: {shown} appears twice in one object; keep only one",
            )
            return

        problems = rules.Problems(keep=max(0, self._max_errors - len(self._errors)))
        custom_id, body = rules.check_envelope(obj, problems)
        if custom_id is not None:
            earlier = self._custom_ids.setdefault(custom_id, number)
            if earlier != number:
                problems.add(
                    "custom_id",
                    "duplicate_custom_id",
                    f"custom_id is already used on line {earlier}; make each custom_id "
                    "unique in the file",
                )
        counts = None
        if body is not None:
            model = rules.check_model(body, problems)
            target = self._target_for(model, number, problems) if model is not None else None
            counts = rules.check_body(body, target, problems)

        for field, code, message in problems:
            self._error(number, field, code, f"Line {number}: {message}")
        # The problems not kept are counted, never built into the report.
        self._error_count += problems.total - len(problems)
        if not problems.total and custom_id is not None and counts is not None:
            max_tokens, n = counts
            self._lines.append(
                LineInfo(
                    offset=line.offset,
                    length=line.length,
                    custom_id=custom_id,
                    max_tokens=max_tokens,
                    n=n,
                )
            )

    def _target_for(self, model: str, number: int, problems: rules.Problems) -> ModelTarget | None:
        """The target of the file's model; every line must name the first line's model."""
        if self._model is None:
            # Resolved once: only the first model named can be right for the file.
            self._model, self._model_line = model, number
            try:
                self._target = self._resolve(model)
            except ModelLookupError as exc:
                problems.add("body.model", exc.code, exc.message)
            return self._target
        if model != self._model:
            shown = f' ("{self._model}")' if _PLAIN_MODEL.fullmatch(self._model) else ""
            problems.add(
                "body.model",
                "model_mismatch",
                f"body.model differs from line {self._model_line}{shown}; every line must "
                "use the same model",
            )
            return None
        return self._target

    def _parse_error(
        self, number: int, offset: int, data: memoryview | bytearray, exc: orjson.JSONDecodeError
    ) -> None:
        if offset == 0 and bytes(data[:3]) == _UTF8_BOM:
            self._error(
                number,
                "",
                "invalid_json",
                f"Line {number}: the file starts with a byte order mark (BOM); save it as UTF-8 "
                "without a BOM",
            )
            return
        # Failures only: decoding a copy here keeps the common path to one parse.
        try:
            text = str(data, "utf-8")
        except UnicodeDecodeError as decode_error:
            self._error(
                number,
                "",
                "invalid_utf8",
                f"Line {number}: byte {decode_error.start + 1} of the line is not valid UTF-8; "
                "save the file as UTF-8",
            )
            return
        if not text.strip():
            self._error(number, "", "blank_line", f"Line {number}: remove the blank line")
            return
        self._error(
            number,
            "",
            "invalid_json",
            f"Line {number}: the line is not valid JSON (error at character {exc.pos + 1}); "
            "each line must be one complete JSON object",
        )
