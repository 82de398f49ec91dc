"""One error family and one renderer for every non-2xx answer (docs/API.md "Errors").

Views and services raise `BoardwalkError` subclasses; `exception_handler` renders them, and
DRF's and Django's own exceptions, in the same envelope:

    {"error": {"type", "code", "message", "param"}}

The OpenAI SDK retries 408/409/429/5xx unless told otherwise (docs/API.md "Errors"). An error that
will succeed later sets `retry_after`: it answers `Retry-After` and `x-should-retry: true` (so the
SDK waits and retries even where it would not by itself); any other 4xx answers `x-should-retry:
false`, so the SDK never resends a request that cannot succeed. A database or broker that cannot be
reached is an outage, not a bug: it answers 503 `backend_unavailable` with `Retry-After`, never 500.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import InterfaceError as DatabaseInterfaceError
from django.db import OperationalError as DatabaseOperationalError
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions as drf
from rest_framework.response import Response

# The codes live in a module of their own (no imports) so that the engine can use them too.
from boardwalk.codes import ErrorCode
from boardwalk.codes import ItemCode as ItemCode
from boardwalk.codes import LineCode as LineCode
from boardwalk.logs import exception_trace

logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_credit_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    411: "invalid_request_error",
    412: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    416: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class BoardwalkError(Exception):
    status = 400
    code: ErrorCode = ErrorCode.INVALID_REQUEST
    # Seconds after which the same request may succeed; None: retrying cannot help.
    retry_after: int | None = None

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | None = None,
        param: str | None = None,
        details: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if retry_after is not None:
            self.retry_after = retry_after
        self.param = param
        self.details = details
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def envelope(self) -> dict[str, Any]:
        return envelope(self.status, self.code, self.message, self.param, self.details, self.extra)


class InvalidRequest(BoardwalkError):
    status = 400


class AuthenticationError(BoardwalkError):
    status = 401
    code = ErrorCode.INVALID_API_KEY

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        # RFC 9110 §11.6.1: a 401 names the scheme that would work.
        self.headers.setdefault("WWW-Authenticate", 'Bearer realm="boardwalk"')


class ScopeError(BoardwalkError):
    status = 403
    code = ErrorCode.INSUFFICIENT_SCOPE


class InsufficientCredit(BoardwalkError):
    status = 402
    code = ErrorCode.INSUFFICIENT_CREDIT


class NotFound(BoardwalkError):
    status = 404
    code = ErrorCode.NOT_FOUND


class RequestTimeout(BoardwalkError):
    status = 408
    code = ErrorCode.REQUEST_TIMEOUT


class LengthRequired(BoardwalkError):
    status = 411
    code = ErrorCode.LENGTH_REQUIRED


class MethodNotAllowed(BoardwalkError):
    status = 405
    code = ErrorCode.METHOD_NOT_ALLOWED


class Conflict(BoardwalkError):
    status = 409
    code = ErrorCode.CONFLICT


class PayloadTooLarge(BoardwalkError):
    status = 413
    code = ErrorCode.FILE_TOO_LARGE


class RangeNotSatisfiable(BoardwalkError):
    status = 416
    code = ErrorCode.RANGE_NOT_SATISFIABLE


class ServiceUnavailable(BoardwalkError):
    """Temporarily unable to answer; the same request will succeed later."""

    status = 503
    code = ErrorCode.SERVICE_UNAVAILABLE
    retry_after: int | None = 5


# Lost or refused connections, lock and statement timeouts, a database restarting: the
# request may succeed as it is once the outage passes.
_OUTAGES: tuple[type[BaseException], ...] = (
    DatabaseOperationalError,
    DatabaseInterfaceError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)


class CapacityExceeded(BoardwalkError):
    """429. `retryable=False` for a limit the same request can never meet."""

    status = 429
    code = ErrorCode.CAPACITY_EXCEEDED
    retry_after: int | None = 60

    def __init__(self, message: str, *, retryable: bool = True, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        if not retryable:
            self.retry_after = None


def envelope(
    status: int,
    code: ErrorCode,
    message: str,
    param: str | None = None,
    details: list[dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
        "code": code,
        "message": message,
        "param": param,
    }
    if details is not None:
        body["details"] = details
    if extra:
        body.update(extra)
    return {"error": body}


def retry_headers(status: int, *, retry_after: int | None = None) -> dict[str, str]:
    """docs/API.md "Errors": say when to retry, or that retrying is pointless; 5xx stays
    retryable."""
    if retry_after is not None:
        return {"Retry-After": str(retry_after), "x-should-retry": "true"}
    if 400 <= status < 500 and status != 408:
        return {"x-should-retry": "false"}
    if status == 503:
        return {"x-should-retry": "true"}
    return {}


def _from_drf(exc: drf.APIException) -> BoardwalkError:
    if isinstance(exc, drf.NotAuthenticated):
        return AuthenticationError(
            "No API key provided. Send it as 'Authorization: Bearer <key>'.",
            code=ErrorCode.MISSING_API_KEY,
        )
    if isinstance(exc, drf.AuthenticationFailed):
        return AuthenticationError(str(exc.detail))
    if isinstance(exc, drf.PermissionDenied):
        return ScopeError(str(exc.detail))
    if isinstance(exc, drf.NotFound):
        return NotFound(str(exc.detail))
    if isinstance(exc, drf.MethodNotAllowed):
        return MethodNotAllowed(str(exc.detail))
    if isinstance(exc, drf.UnsupportedMediaType):
        error = InvalidRequest(str(exc.detail), code=ErrorCode.UNSUPPORTED_MEDIA_TYPE)
        error.status = 415
        return error
    if isinstance(exc, drf.ParseError):
        return InvalidRequest(
            f"The request body is not valid JSON: {exc.detail}", code=ErrorCode.INVALID_JSON
        )
    if isinstance(exc, drf.Throttled):
        return CapacityExceeded(str(exc.detail), retry_after=int(getattr(exc, "wait", None) or 60))
    if isinstance(exc, drf.ValidationError):
        param, message = _first_validation_error(exc.detail)
        return InvalidRequest(message, code=ErrorCode.INVALID_REQUEST, param=param)
    if isinstance(exc, drf.NotAcceptable):
        error = InvalidRequest(str(exc.detail), code=ErrorCode.NOT_ACCEPTABLE)
        error.status = 406
        return error
    # Any other DRF exception is one of ours we forgot to map: its DRF code is not in the enum.
    generic = BoardwalkError(
        str(exc.detail),
        code=ErrorCode.INTERNAL_ERROR if exc.status_code >= 500 else ErrorCode.INVALID_REQUEST,
    )
    generic.status = exc.status_code
    return generic


def _first_validation_error(detail: Any, prefix: str = "") -> tuple[str | None, str]:
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = key if key != "non_field_errors" else ""
            full = f"{prefix}.{name}" if prefix and name else (name or prefix)
            param, message = _first_validation_error(value, full)
            return param, (f"{full}: {message}" if full and param == full else message)
    if isinstance(detail, list) and detail:
        return _first_validation_error(detail[0], prefix)
    return (prefix or None), str(detail)


def render(error: BoardwalkError) -> Response:
    headers = {**retry_headers(error.status, retry_after=error.retry_after), **error.headers}
    return Response(error.envelope(), status=error.status, headers=headers)


def render_plain(error: BoardwalkError) -> JsonResponse:
    """The envelope as a plain Django response, for middleware (outside DRF's rendering)."""
    headers = {**retry_headers(error.status, retry_after=error.retry_after), **error.headers}
    return JsonResponse(error.envelope(), status=error.status, headers=headers)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, BoardwalkError):
        return render(exc)
    if isinstance(exc, Http404):
        return render(NotFound("No such resource."))
    if isinstance(exc, DjangoPermissionDenied):
        return render(ScopeError("Permission denied."))
    if isinstance(exc, drf.APIException):
        return render(_from_drf(exc))
    if isinstance(exc, _OUTAGES):
        # Type and frames only: a driver message can quote the statement and its parameters.
        logger.error("outage answered 503: %s", exception_trace(exc))
        return render(
            ServiceUnavailable(
                "A backing service (database or queue) is unavailable right now; retry shortly.",
                code=ErrorCode.BACKEND_UNAVAILABLE,
            )
        )
    return None  # unexpected: Django's 500 handler (below) answers in the envelope


def _json(status: int, code: ErrorCode, message: str) -> JsonResponse:
    return JsonResponse(
        envelope(status, code, message), status=status, headers=retry_headers(status)
    )


def handler404(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return _json(404, ErrorCode.NOT_FOUND, f"Unknown path {request.path!r}.")


def handler500(request: HttpRequest) -> JsonResponse:
    return _json(500, ErrorCode.INTERNAL_ERROR, "Internal server error. Retry later.")


def handler400(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return _json(400, ErrorCode.BAD_REQUEST, "Bad request.")


def handler403(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return _json(403, ErrorCode.FORBIDDEN, "Forbidden.")
