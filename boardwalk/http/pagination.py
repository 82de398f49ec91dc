"""What every list endpoint shares: the `limit` parameter (as /v1/openapi.json describes it)
and the list object it answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from boardwalk.codes import ErrorCode
from boardwalk.errors import InvalidRequest

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def parse_limit(raw: str | None) -> int:
    """The `limit` query parameter, as /v1/openapi.json describes it: absent means the
    default, anything else must be the decimal digits of an integer from 1 to MAX_LIMIT.

    An empty `limit=` is refused like any other invalid value: the OpenAI SDK leaves an unset
    limit out of the query, so an empty one is a caller's bug (an unset variable). So are
    `+5`, ` 5` and `1_0`, which int() alone would take.
    """
    if raw is None:
        return DEFAULT_LIMIT
    try:
        limit = int(raw) if raw.isascii() and raw.isdigit() else 0
    except ValueError:  # more digits than int() converts
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(
            f"limit must be an integer from 1 to {MAX_LIMIT}.",
            code=ErrorCode.INVALID_LIMIT,
            param="limit",
        )
    return limit


def list_envelope(data: Sequence[Any], *, has_more: bool | None = None) -> dict[str, Any]:
    """The list object: `object` and `data`; a page of resources (`has_more` given) adds the
    cursor fields a client pages on (`first_id`, `last_id`: the ids at its two ends)."""
    envelope: dict[str, Any] = {"object": "list", "data": list(data)}
    if has_more is not None:
        envelope["first_id"] = data[0]["id"] if data else None
        envelope["last_id"] = data[-1]["id"] if data else None
        envelope["has_more"] = has_more
    return envelope
