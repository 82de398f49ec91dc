from __future__ import annotations

from typing import Any

from rest_framework.response import Response
from rest_framework.views import APIView

from boardwalk import openapi as oa
from boardwalk.auth import READ, WRITE
from boardwalk.codes import ErrorCode
from boardwalk.errors import InvalidRequest
from webhooks.selectors import webhook_endpoint_get_for_org, webhook_endpoints_for_org
from webhooks.serializers import endpoint_payload
from webhooks.services import webhook_endpoint_create, webhook_endpoint_delete

_CREATE_FIELDS = {"url", "events"}


class WebhookEndpointCollectionView(APIView):
    scopes = {"POST": WRITE, "GET": READ}

    @oa.operation(oa.WEBHOOK_ENDPOINT, request=oa.WEBHOOK_ENDPOINT_CREATE)
    def post(self, request: Any) -> Response:
        body = request.data
        if not isinstance(body, dict):
            raise InvalidRequest(
                "The request body must be a JSON object.", code=ErrorCode.INVALID_BODY
            )
        unknown = sorted(set(body) - _CREATE_FIELDS)
        if unknown:
            raise InvalidRequest(
                f"Unknown field {unknown[0]!r}; allowed: url, events.",
                code=ErrorCode.UNKNOWN_PARAMETER,
                param=unknown[0],
            )
        endpoint, secret = webhook_endpoint_create(
            org=request.user.org, url=body.get("url"), events=body.get("events")
        )
        return Response(endpoint_payload(endpoint, secret=secret))

    @oa.operation(oa.list_of(oa.WEBHOOK_ENDPOINT), operation_id="webhook_endpoints_list")
    def get(self, request: Any) -> Response:
        data = [endpoint_payload(e) for e in webhook_endpoints_for_org(org=request.user.org)]
        return Response(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": False,
            }
        )


class WebhookEndpointDetailView(APIView):
    scopes = {"GET": READ, "DELETE": WRITE}

    @oa.operation(oa.WEBHOOK_ENDPOINT)
    def get(self, request: Any, endpoint_id: str) -> Response:
        endpoint = webhook_endpoint_get_for_org(org=request.user.org, endpoint_id=endpoint_id)
        return Response(endpoint_payload(endpoint))

    @oa.operation(oa.DELETED)
    def delete(self, request: Any, endpoint_id: str) -> Response:
        endpoint = webhook_endpoint_get_for_org(org=request.user.org, endpoint_id=endpoint_id)
        webhook_endpoint_delete(endpoint=endpoint)
        return Response({"id": endpoint_id, "object": "webhook_endpoint", "deleted": True})
