"""Request bodies that are JSON objects of known fields: one rule for every endpoint."""

from __future__ import annotations

from typing import Any

from boardwalk.codes import ErrorCode
from boardwalk.errors import InvalidRequest


def body_fields(data: Any, allowed: tuple[str, ...], *, what: str) -> dict[str, Any]:
    """`data` as a dict holding only `allowed` fields (400 naming the first other one);
    `what` names the thing in the message ("a batch", "a webhook endpoint")."""
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code=ErrorCode.INVALID_BODY)
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise InvalidRequest(
            f"Unknown field {unknown[0]!r}; {what} takes only {', '.join(allowed) or 'none'}.",
            code=ErrorCode.UNKNOWN_PARAMETER,
            param=unknown[0],
        )
    return dict(data)
