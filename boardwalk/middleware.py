"""Every answer carries an `x-request-id` (SPEC §10a; the OpenAI SDK exposes it as `request_id`).

The id is ours, never the client's: a client-chosen value would let one request pose as
another in the logs. It names the HTTP request only (`hreq_…`), not a receipt (`req_…`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase

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
