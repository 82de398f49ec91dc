"""Middleware that runs before any view.

`RequestIdMiddleware`: every answer carries an `x-request-id` (docs/API.md "Errors"; the OpenAI SDK
exposes it as `request_id`). The id is ours, never the client's: a client-chosen value would let
one request pose as another in the logs. It names the HTTP request only (`hreq_…`), not a
receipt (`req_…`).

`RequestLimitsMiddleware`: limits on what a request may send, checked before any view reads
the body.

- A body must come with a Content-Length: `Transfer-Encoding: chunked` is answered 411 (the
  upload reader and the size limits work on a declared length).
- A declared length over DATA_UPLOAD_MAX_MEMORY_SIZE answers 413 before a byte of the body is
  read, except for views that stream their body and enforce their own limit
  (`reads_own_body = True`, e.g. POST /v1/files).
- A body the client sends too slowly (project.server.BoundedSocket raises TimeoutError
  from the read) answers 408 instead of a 500.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from boardwalk.codes import ErrorCode
from boardwalk.errors import (
    InvalidRequest,
    LengthRequired,
    PayloadTooLarge,
    RequestTimeout,
    render_plain,
)
from boardwalk.ids import new_id

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        request_id = new_id("hreq_")
        request.request_id = request_id  # type: ignore[attr-defined]
        response = self.get_response(request)
        response[REQUEST_ID_HEADER] = request_id
        if response.status_code >= 500:
            # Ids and status only: the path may carry ids, never content.
            logger.error(
                "request failed id=%s status=%s %s %s",
                request_id,
                response.status_code,
                request.method,
                request.path,
            )
        return response


class RequestLimitsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.META.get("HTTP_TRANSFER_ENCODING"):
            return render_plain(
                LengthRequired(
                    "Send the request body with a Content-Length header; chunked transfer "
                    "encoding is not supported. (curl: use -F or --data-binary with a file, "
                    "not a pipe.)"
                )
            )
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view: Any, args: Any, kwargs: Any
    ) -> HttpResponse | None:
        raw = (request.META.get("CONTENT_LENGTH") or "0").strip()
        if not raw.isascii() or not raw.isdigit():
            return render_plain(
                InvalidRequest(
                    "The Content-Length header is not a number.", code=ErrorCode.BAD_REQUEST
                )
            )
        if getattr(getattr(view, "cls", None), "reads_own_body", False):
            return None
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if len(raw.lstrip("0")) > 18 or int(raw) > limit:
            return render_plain(
                PayloadTooLarge(
                    f"The request body is larger than this endpoint accepts ({limit} bytes).",
                    code=ErrorCode.REQUEST_TOO_LARGE,
                )
            )
        return None

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        # Django re-raises a failed body read as UnreadablePostError, from the original error.
        cause: BaseException | None = exception
        while cause is not None and not isinstance(cause, TimeoutError):
            cause = cause.__cause__
        if cause is not None:
            return render_plain(
                RequestTimeout(
                    "The request body arrived too slowly; send it again on a faster connection."
                )
            )
        return None
