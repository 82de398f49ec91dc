"""Parsing of the POST /v1/batches body (docs/API.md "Batches"): strict, every problem a clear
400."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batches.batchrouter import Assignment, assignment_parse
from boardwalk import clock
from boardwalk.bodies import body_fields
from boardwalk.codes import ErrorCode
from boardwalk.errors import InvalidRequest

FIELDS = ("input_file_id", "endpoint", "completion_window", "metadata")
ENDPOINT = "/v1/chat/completions"
WINDOW = "24h"


@dataclass(frozen=True)
class BatchSubmission:
    input_file_id: str
    assignment: Assignment = field(default_factory=Assignment)

    @property
    def metadata(self) -> dict[str, str] | None:
        """The accepted metadata as sent; null when there was none."""
        return self.assignment.metadata or None


def parse_submission(data: Any) -> BatchSubmission:
    data = body_fields(data, FIELDS, what="a batch")
    file_id = data.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise InvalidRequest(
            "input_file_id is required: the id returned by POST /v1/files.",
            code=ErrorCode.MISSING_REQUIRED_PARAMETER
            if file_id is None
            else ErrorCode.INVALID_INPUT_FILE_ID,
            param="input_file_id",
        )
    if data.get("endpoint") != ENDPOINT:
        raise InvalidRequest(
            f"endpoint must be {ENDPOINT!r}, the only batch endpoint.",
            code=ErrorCode.INVALID_ENDPOINT,
            param="endpoint",
        )
    if data.get("completion_window") != WINDOW:
        raise InvalidRequest(
            f"completion_window must be {WINDOW!r}, the only supported window.",
            code=ErrorCode.INVALID_COMPLETION_WINDOW,
            param="completion_window",
        )
    assignment = assignment_parse(data.get("metadata"), now=clock.now())
    return BatchSubmission(input_file_id=file_id, assignment=assignment)
