"""BatchRouter Standard assignment fields in a batch's `metadata` (docs/API.md "Batches").

Two passes, because some rules need only the body and others need what the input file
resolves to:

- `assignment_parse` (at request parsing): every key known, every value well-formed, the
  deadline in the future. Used by create and estimate alike.
- `assignment_check_target` (at planning): payment rates equal the pinned catalog model's
  published batch prices and are refused for deployments; the input format and the file agree
  both ways.

`Assignment.expires_at` is the effective deadline: the earliest of the deadline, acceptance +
the assignment window, and acceptance + 24 h. It becomes the batch's `expires_at` and every
item's claim deadline, so it drives scheduling (earliest deadline first) and expiry.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

from boardwalk.codes import ErrorCode
from boardwalk.errors import InvalidRequest

WINDOW = dt.timedelta(hours=24)

WORK_UNIT_ID = "batchrouter_work_unit_id"
DEADLINE = "batchrouter_deadline"
ASSIGNMENT_WINDOW = "batchrouter_assignment_window"
TIER = "batchrouter_tier"
ROLE = "batchrouter_role"
INPUT_RATE = "batchrouter_input_rate"
CACHED_INPUT_RATE = "batchrouter_cached_input_rate"
OUTPUT_RATE = "batchrouter_output_rate"
INPUT_FORMAT = "batchrouter_input_format"

KEYS = (
    WORK_UNIT_ID,
    DEADLINE,
    ASSIGNMENT_WINDOW,
    TIER,
    ROLE,
    INPUT_RATE,
    CACHED_INPUT_RATE,
    OUTPUT_RATE,
    INPUT_FORMAT,
)
RATE_KEYS = (INPUT_RATE, CACHED_INPUT_RATE, OUTPUT_RATE)
TIERS = ("standard",)
ROLES = ("executor",)
SECTIONED_FORMAT = "sectioned.v1"
INPUT_FORMATS = (SECTIONED_FORMAT,)

# RFC 3339 date-time with a mandatory offset ("Z" or ±hh:mm); fractional seconds allowed.
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})"
)
# A bounded count keeps the arithmetic small; anything past 24 h is cut to 24 h anyway.
_DURATION = re.compile(r"(\d{1,12})([smh])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
_RATE = re.compile(r"0|[1-9]\d{0,17}")


@dataclass(frozen=True)
class Assignment:
    """The accepted metadata (kept as sent) and what it means."""

    metadata: dict[str, str] = field(default_factory=dict)
    deadline: dt.datetime | None = None
    window: dt.timedelta | None = None
    rates: dict[str, int] = field(default_factory=dict)
    input_format: str | None = None

    def expires_at(self, accepted_at: dt.datetime) -> dt.datetime:
        candidates = [accepted_at + WINDOW]
        if self.window is not None:
            candidates.append(accepted_at + self.window)
        if self.deadline is not None:
            candidates.append(self.deadline)
        return min(candidates)


def _invalid(key: str, message: str) -> InvalidRequest:
    return InvalidRequest(
        f"metadata.{key}: {message}", code=ErrorCode.INVALID_METADATA, param=f"metadata.{key}"
    )


def assignment_parse(metadata: Any, *, now: dt.datetime) -> Assignment:
    """Check the `metadata` object of a create/estimate body; raises InvalidRequest (400)."""
    if metadata is None:
        return Assignment()
    if not isinstance(metadata, dict):
        raise InvalidRequest(
            "metadata must be an object of BatchRouter assignment fields, or null.",
            code=ErrorCode.INVALID_METADATA,
            param="metadata",
        )
    for key in metadata:
        if key not in KEYS:
            raise InvalidRequest(
                f"Unsupported metadata key {key!r}: metadata takes only the BatchRouter "
                f"assignment fields ({', '.join(KEYS)}).",
                code=ErrorCode.UNSUPPORTED_METADATA,
                param=f"metadata.{key}",
            )
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise _invalid(key, "the value must be a string.")

    work_unit = metadata.get(WORK_UNIT_ID)
    if work_unit is not None and not 1 <= len(work_unit.encode()) <= 128:
        raise _invalid(WORK_UNIT_ID, "must be 1 to 128 bytes of UTF-8.")

    tier = metadata.get(TIER)
    if tier is not None and tier not in TIERS:
        raise InvalidRequest(
            f"metadata.{TIER}: tier {tier!r} is not supported; the only tier is 'standard'.",
            code=ErrorCode.UNSUPPORTED_METADATA,
            param=f"metadata.{TIER}",
        )
    role = metadata.get(ROLE)
    if role is not None and role not in ROLES:
        raise InvalidRequest(
            f"metadata.{ROLE}: role {role!r} is not supported; the only role is 'executor'.",
            code=ErrorCode.UNSUPPORTED_METADATA,
            param=f"metadata.{ROLE}",
        )
    input_format = metadata.get(INPUT_FORMAT)
    if input_format is not None and input_format not in INPUT_FORMATS:
        raise InvalidRequest(
            f"metadata.{INPUT_FORMAT}: format {input_format!r} is not supported; the only "
            f"format is {SECTIONED_FORMAT!r}.",
            code=ErrorCode.UNSUPPORTED_METADATA,
            param=f"metadata.{INPUT_FORMAT}",
        )

    deadline = None
    if DEADLINE in metadata:
        deadline = _parse_deadline(metadata[DEADLINE], now=now)
    window = None
    if ASSIGNMENT_WINDOW in metadata:
        window = _parse_window(metadata[ASSIGNMENT_WINDOW])
    rates = {}
    for key in RATE_KEYS:
        if key in metadata:
            if not _RATE.fullmatch(metadata[key]):
                raise _invalid(
                    key,
                    "must be a non-negative integer in microusd per million tokens, e.g. '150000'.",
                )
            rates[key] = int(metadata[key])
    return Assignment(
        metadata=dict(metadata),
        deadline=deadline,
        window=window,
        rates=rates,
        input_format=input_format,
    )


def _parse_deadline(value: str, *, now: dt.datetime) -> dt.datetime:
    if not _RFC3339.fullmatch(value):
        raise _invalid(
            DEADLINE,
            "must be an RFC 3339 timestamp with an offset, e.g. '2026-12-01T18:00:00Z'.",
        )
    try:
        deadline = dt.datetime.fromisoformat(value.upper())
    except ValueError as exc:  # e.g. month 13: the shape matched, the date does not exist
        raise _invalid(DEADLINE, "is not a valid date and time.") from exc
    if deadline <= now:
        raise _invalid(DEADLINE, "is in the past; give a deadline in the future.")
    return deadline.astimezone(dt.UTC)


def _parse_window(value: str) -> dt.timedelta:
    match = _DURATION.fullmatch(value)
    if match is None:
        raise _invalid(
            ASSIGNMENT_WINDOW,
            "must be a duration like '90s', '30m' or '6h' (an integer and s, m or h).",
        )
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise _invalid(ASSIGNMENT_WINDOW, "must be longer than zero.")
    return min(dt.timedelta(seconds=seconds), WINDOW)


def assignment_check_target(
    assignment: Assignment,
    *,
    prices: tuple[int, int, int] | None,
    file_format: str | None,
) -> None:
    """Rules that need the resolved target and the input file.

    `prices` is the pinned catalog model's (input, cached_input, output) batch prices, or None
    for a private deployment (billed per GPU-second: payment rates make no sense there).
    `file_format` is the input file's detected format (None for the standard format).
    """
    if assignment.rates:
        first = next(k for k in RATE_KEYS if k in assignment.rates)
        if prices is None:
            raise InvalidRequest(
                f"metadata.{first}: payment rates apply to catalog models only; a private "
                "deployment is billed per GPU-second. Remove the rate fields.",
                code=ErrorCode.INVALID_METADATA,
                param=f"metadata.{first}",
            )
        for key, published in zip(RATE_KEYS, prices, strict=True):
            offered = assignment.rates.get(key)
            if offered is not None and offered != published:
                raise InvalidRequest(
                    f"metadata.{key}: the offered rate {offered} differs from the model's "
                    f"published batch price {published} (microusd per million tokens).",
                    code=ErrorCode.RATE_MISMATCH,
                    param=f"metadata.{key}",
                )
    if assignment.input_format != file_format:
        if assignment.input_format is None:
            message = (
                f"The input file is in the {file_format!r} format; say so with "
                f"metadata.{INPUT_FORMAT} = {file_format!r}."
            )
        else:
            message = (
                f"metadata.{INPUT_FORMAT} is {assignment.input_format!r} but the input file is "
                "in the standard format; upload a file that starts with the "
                '{"type":"header","format":"batchrouter.sectioned.v1"} line, or drop the field.'
            )
        raise InvalidRequest(
            message, code=ErrorCode.INPUT_FORMAT_MISMATCH, param=f"metadata.{INPUT_FORMAT}"
        )
