"""`POST /v1/chat/completions`: thin; the rules are in service, the transport in relay.

Money at the edges (docs/BILLING.md, "Interactive requests"): every path that answers an
error (a status, or a stream's error event) voids the request (service.interactive_void), so
it is never charged; a stream cut short (the client closed it, the broker failed under it)
is stopped and pays its prompt and the tokens generated until then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from django.http import StreamingHttpResponse
from rest_framework.response import Response
from rest_framework.views import APIView

from batches.interactive import relay, schemas
from batches.interactive.feed import completion_id
from batches.interactive.service import Accepted, interactive_accept, interactive_void
from batches.interactive.streaming import Chunks, event
from boardwalk.auth import WRITE
from boardwalk.codes import ErrorCode, ItemCode
from boardwalk.errors import BoardwalkError, InvalidRequest, ServiceUnavailable
from boardwalk.http import openapi as oa
from boardwalk.logs import exception_trace

logger = logging.getLogger(__name__)


class EngineFailed(BoardwalkError):
    status = 500
    code = ErrorCode.INTERNAL_ERROR


def reply_error(code: str) -> BoardwalkError:
    """A worker's error reply as the API's answer."""
    if code == ItemCode.CONTEXT_LENGTH_EXCEEDED:
        return InvalidRequest(
            "The prompt plus max_completion_tokens exceed the model's context; shorten either.",
            code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            param="messages",
        )
    if code == ItemCode.INVALID_REQUEST:
        return InvalidRequest("The engine refused this request as invalid.")
    if code in ("timeout", "aborted"):
        return ServiceUnavailable("The request did not finish in time; retry it.")
    if code == ItemCode.UPSTREAM_UNAVAILABLE:
        # An external engine's server answered every attempt overloaded, or not at all.
        return ServiceUnavailable("The model's server is overloaded or unreachable; retry later.")
    if code == ItemCode.INVALID_MODEL_OUTPUT:
        # An external engine's server answered, but not as the request's schema or tools ask.
        return EngineFailed(
            "The model's answer did not match this request's response_format or tools, so it "
            "was not returned; retry it, or ask the operator to turn on structured outputs in "
            "the model's server.",
            code=ErrorCode.INVALID_MODEL_OUTPUT,
        )
    if code == ErrorCode.MODEL_LOAD_FAILED:
        return ServiceUnavailable(
            "The workers could not load this model; an operator must check it "
            "(manage.py model inspect). Retry later.",
            code=ErrorCode.MODEL_LOAD_FAILED,
        )
    if code == relay.WORKER_LOST:
        return ServiceUnavailable("The worker running this request stopped; retry it.")
    return EngineFailed("The engine failed on this request; retry it.")


class ChatCompletionsView(APIView):
    scopes = {"POST": WRITE}

    @oa.operation(
        None,
        errors=(402, 429, 503),
        request=schemas.CHAT_COMPLETION_REQUEST,
        ok_content={
            "application/json": schemas.CHAT_COMPLETION,
            "text/event-stream": schemas.EVENT_STREAM,
        },
        operation_id="chat_completions_create",
    )
    def post(self, request: Any) -> Any:
        accepted = interactive_accept(org=request.user.org, data=request.data)
        try:
            relay.dispatch(accepted)
            try:
                refused = relay.wait_taken(accepted)
            except relay.NotTaken:
                raise ServiceUnavailable(
                    "No worker could take this request in time; retry shortly.",
                    code=ErrorCode.SERVICE_UNAVAILABLE,
                ) from None
            if refused is not None:
                raise reply_error(refused.get("code", ""))
            if not accepted.submitted.stream:
                response: Any = _complete(accepted)
        except BaseException:
            _answered_with_error(accepted)
            raise
        finally:
            if not accepted.submitted.stream:
                relay.done(accepted)
                accepted.admission.release()
        if accepted.submitted.stream:
            response = StreamingHttpResponse(
                _stream(accepted), content_type="text/event-stream; charset=utf-8"
            )
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"  # a proxy must not hold the events back
        for name, value in accepted.admission.headers.items():
            response[name] = value
        return response


def _complete(accepted: Accepted) -> Response:
    for message in relay.replies(accepted):
        if message["kind"] == "result":
            return Response({**message["body"], "service_tier": accepted.submitted.service_tier})
        if message["kind"] == "error":
            raise reply_error(message.get("code", ""))
    raise EngineFailed("The request ended without a result.")


def _stream(accepted: Accepted) -> Iterator[bytes]:
    submitted = accepted.submitted
    chunks = Chunks(
        completion_id=completion_id(submitted.id),
        model=submitted.body["model"],
        created=int(time.time()),
        fingerprint=accepted.revision_id,
        tier=submitted.service_tier,
        include_usage=accepted.include_usage,
        n=int(submitted.body.get("n") or 1),
        buffer_text=bool(submitted.body.get("tools")),
    )
    finished = False
    try:
        yield from chunks.opening()
        try:
            for message in relay.replies(accepted):
                kind = message["kind"]
                if kind == "delta":
                    yield from chunks.partial(
                        message["index"], message["text"], message.get("reasoning", "")
                    )
                elif kind == "result":
                    finished = True
                    yield from chunks.closing(message["body"])
                elif kind == "error":
                    finished = True
                    _answered_with_error(accepted)
                    error = reply_error(message.get("code", ""))
                    yield event(error.envelope())
        except Exception as exc:
            # The broker failed under the stream: the request is cut (the worker stops it
            # once its replies cannot be delivered or its listener flag lapses) and pays what
            # it generated. The client is told why its stream ends here.
            logger.warning("stream of %s cut: %s", accepted.submitted.id, exception_trace(exc))
            yield event(
                ServiceUnavailable(
                    "The connection to the workers broke; the stream ends here.",
                    code=ErrorCode.BACKEND_UNAVAILABLE,
                ).envelope()
            )
    finally:
        # Closed before its end: the client went away, so the engine frees its rows.
        if not finished:
            relay.abort(accepted)
        relay.done(accepted)
        accepted.admission.release()


def _answered_with_error(accepted: Accepted) -> None:
    """An error answer: stop the request if it runs, and void its charge (never billed)."""
    relay.done(accepted)
    relay.abort(accepted)
    try:
        interactive_void(accepted)
    except Exception as exc:
        # The database is down too: the orphan sweep releases the hold once it can, and a
        # worker that ran the request settles it as it ended.
        logger.error("interactive %s not voided: %s", accepted.submitted.id, exception_trace(exc))
