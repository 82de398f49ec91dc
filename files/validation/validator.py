"""The streaming validator for batch input files: standard (docs/API.md "Standard input lines") and
BatchRouter sectioned (docs/API.md "BatchRouter sectioned input", detected from a header on the
first line)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from boardwalk.codes import LineCode

from . import rules, sectioned
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


@dataclass(frozen=True)
class _Section:
    line: int
    offset: int
    length: int
    body: dict[str, Any] | None  # None: the section line has errors


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
        # Sectioned format only: sections by id, the nearest one above, their bytes held.
        self._format: str | None = None
        self._sections: dict[str, _Section] = {}
        self._current_section: _Section | None = None
        self._section_bytes = 0
        self._requests = 0

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
            self._error(
                0, "", LineCode.EMPTY_FILE, "The file is empty; add at least one request line"
            )
        elif self._format is not None and self._requests == 0 and count <= self._max_lines:
            self._error(
                0,
                "",
                LineCode.EMPTY_FILE,
                "The file has no request lines; add at least one request",
            )
        elif count > self._max_lines:
            self._error(
                self._max_lines + 1,
                "",
                LineCode.TOO_MANY_LINES,
                f"Line {self._max_lines + 1}: the file has {count} lines; at most "
                f"{self._max_lines} are allowed, so split it into several files",
            )
        return ValidationReport(
            errors=self._errors,
            error_count=self._error_count,
            lines=self._lines,
            model=self._model,
            total_bytes=self._splitter.total_bytes,
            format=self._format,
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
                LineCode.LINE_TOO_LARGE,
                f"Line {number}: the line is {line.length} bytes; a line may hold at most "
                f"{self._max_line_bytes} bytes",
            )
            return
        if line.length == 0:
            self._error(number, "", LineCode.BLANK_LINE, f"Line {number}: remove the blank line")
            return
        data = line.data
        # A line within one read is a view of it; a copy of at most a read lets bytes methods run.
        text = data if isinstance(data, bytearray) else bytes(data)
        if too_many_values(text):
            self._error(
                number,
                "",
                LineCode.TOO_MANY_VALUES,
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
                number, "", LineCode.NOT_AN_OBJECT, f"Line {number}: the line must be a JSON object"
            )
            return
        if has_duplicate_keys(text, obj):
            # orjson keeps the last of duplicate keys; which one a client meant is unknowable.
            field = duplicate_key_field(text)
            shown = field or "a key"
            self._error(
                number,
                field,
                LineCode.DUPLICATE_KEY,
                f"Line {number}: {shown} appears twice in one object; keep only one",
            )
            return

        if number == 1 and sectioned.is_header(obj):
            self._format = sectioned.FILE_FORMAT
            problems = self._problems()
            sectioned.check_header(obj, problems)
            self._report(number, problems)
            return
        if self._format is not None:
            self._check_sectioned(line, obj)
            return
        problems = self._problems()
        custom_id, body = rules.check_envelope(obj, problems)
        self._check_request(line, problems, custom_id, body)

    def _check_request(
        self,
        line: Line,
        problems: rules.Problems,
        custom_id: str | None,
        body: dict[str, Any] | None,
        section: _Section | None = None,
    ) -> None:
        """The rules every (effective) request obeys; records the line when it has none."""
        number = line.number
        if custom_id is not None:
            earlier = self._custom_ids.setdefault(custom_id, number)
            if earlier != number:
                problems.add(
                    "custom_id",
                    LineCode.DUPLICATE_CUSTOM_ID,
                    f"custom_id is already used on line {earlier}; make each custom_id "
                    "unique in the file",
                )
        counts = None
        if body is not None:
            model = rules.check_model(body, problems)
            target = self._target_for(model, number, problems) if model is not None else None
            counts = rules.check_body(body, target, problems)

        self._report(number, problems)
        if not problems.total and custom_id is not None and counts is not None:
            max_tokens, n = counts
            self._lines.append(
                LineInfo(
                    offset=line.offset,
                    length=line.length,
                    custom_id=custom_id,
                    max_tokens=max_tokens,
                    n=n,
                    section_offset=section.offset if section is not None else None,
                    section_length=section.length if section is not None else 0,
                )
            )

    def _problems(self) -> rules.Problems:
        # Keep only what the report can still show; the rest are counted, never built.
        return rules.Problems(keep=max(0, self._max_errors - len(self._errors)))

    def _report(self, number: int, problems: rules.Problems) -> None:
        for field, code, message in problems:
            self._error(number, field, code, f"Line {number}: {message}")
        # The problems not kept are counted, never built into the report.
        self._error_count += problems.total - len(problems)

    def _check_sectioned(self, line: Line, obj: dict[str, Any]) -> None:
        problems = self._problems()
        kind = obj.get("type")
        if kind == "section":
            self._check_section_line(line, obj, problems)
        elif kind == "request":
            self._requests += 1
            custom_id, section_id, body = sectioned.check_request(obj, problems)
            section = self._section_of(section_id, problems)
            if section is None or section.body is None or body is None:
                body = None
            else:
                body = sectioned.effective_body(section.body, body)
            self._check_request(line, problems, custom_id, body, section)
            return
        elif kind == "header":
            problems.add(
                "type", LineCode.MISPLACED_HEADER, "the header belongs on the first line only"
            )
        else:
            problems.add(
                "type",
                LineCode.INVALID_LINE_TYPE,
                'type must be "section" or "request" (the header is the first line)',
            )
        self._report(line.number, problems)

    def _check_section_line(
        self, line: Line, obj: dict[str, Any], problems: rules.Problems
    ) -> None:
        section_id, body = sectioned.check_section(obj, problems)
        if section_id is not None and section_id in self._sections:
            problems.add(
                "section_id",
                LineCode.DUPLICATE_SECTION_ID,
                f"section_id is already used on line {self._sections[section_id].line}; "
                "make each section_id unique in the file",
            )
        self._section_bytes += line.length
        if self._section_bytes > sectioned.MAX_SECTION_BYTES:
            problems.add(
                "",
                LineCode.SECTIONS_TOO_LARGE,
                f"the sections of this file hold more than {sectioned.MAX_SECTION_BYTES} bytes "
                "in all; split the file",
            )
        section = _Section(line.number, line.offset, line.length, None if problems.total else body)
        if section_id is not None and section_id not in self._sections:
            self._sections[section_id] = section
        # Requests below without a section_id belong to this section, broken or not.
        self._current_section = section

    def _section_of(self, section_id: str | None, problems: rules.Problems) -> _Section | None:
        if section_id is not None:
            section = self._sections.get(section_id)
            if section is None:
                problems.add(
                    "section_id",
                    LineCode.UNKNOWN_SECTION,
                    "section_id names no section defined above this line; define each section "
                    "before the requests that use it",
                )
                return None
        else:
            section = self._current_section
            if section is None:
                problems.add(
                    "section_id",
                    LineCode.MISSING_SECTION,
                    "this request has no section: add a section line above it or give its "
                    "section_id",
                )
                return None
        if section.body is None:
            problems.add(
                "section_id",
                LineCode.INVALID_SECTION,
                f"the request's section (line {section.line}) has errors; fix that line first",
            )
        return section

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
                LineCode.MODEL_MISMATCH,
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
                LineCode.INVALID_JSON,
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
                LineCode.INVALID_UTF8,
                f"Line {number}: byte {decode_error.start + 1} of the line is not valid UTF-8; "
                "save the file as UTF-8",
            )
            return
        if not text.strip():
            self._error(number, "", LineCode.BLANK_LINE, f"Line {number}: remove the blank line")
            return
        self._error(
            number,
            "",
            LineCode.INVALID_JSON,
            f"Line {number}: the line is not valid JSON (error at character {exc.pos + 1}); "
            "each line must be one complete JSON object",
        )
