from __future__ import annotations

from typing import Any

from rest_framework.response import Response
from rest_framework.views import APIView

from boardwalk.auth import READ, WRITE
from boardwalk.bodies import body_fields
from boardwalk.http import openapi as oa
from boardwalk.http.pagination import list_envelope, parse_limit
from webhooks import schemas
from webhooks.models import EVENT_TYPES
from webhooks.selectors import webhook_endpoint_get_for_org, webhook_endpoints_page
from webhooks.serializers import deleted_payload, endpoint_payload, endpoint_test_payload
from webhooks.services import (
    UPDATABLE_FIELDS,
    webhook_endpoint_create,
    webhook_endpoint_delete,
    webhook_endpoint_rotate_secret,
    webhook_endpoint_test,
    webhook_endpoint_update,
)


def _body(request: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    """The JSON object sent (none at all reads as empty), holding only `allowed` fields."""
    return body_fields(request.data, allowed, what="a webhook endpoint request")


class WebhookEndpointCollectionView(APIView):
    scopes = {"POST": WRITE, "GET": READ}

    @oa.operation(
        schemas.WEBHOOK_ENDPOINT_WITH_SECRET, errors=(409,), request=schemas.WEBHOOK_ENDPOINT_CREATE
    )
    def post(self, request: Any) -> Response:
        body = _body(request, UPDATABLE_FIELDS)
        endpoint, secret = webhook_endpoint_create(
            org=request.user.org,
            name=body.get("name"),
            url=body.get("url"),
            event_types=body.get("event_types"),
        )
        return Response(endpoint_payload(endpoint, secret=secret))

    @oa.operation(
        oa.list_of(schemas.WEBHOOK_ENDPOINT),
        operation_id="webhook_endpoints_list",
        parameters=oa.PAGINATION,
    )
    def get(self, request: Any) -> Response:
        endpoints, has_more = webhook_endpoints_page(
            org=request.user.org,
            limit=parse_limit(request.query_params.get("limit")),
            after=request.query_params.get("after"),
        )
        return Response(list_envelope([endpoint_payload(e) for e in endpoints], has_more=has_more))


class WebhookEndpointDetailView(APIView):
    scopes = {"GET": READ, "POST": WRITE, "DELETE": WRITE}

    @oa.operation(schemas.WEBHOOK_ENDPOINT)
    def get(self, request: Any, endpoint_id: str) -> Response:
        endpoint = webhook_endpoint_get_for_org(org=request.user.org, endpoint_id=endpoint_id)
        return Response(endpoint_payload(endpoint))

    @oa.operation(
        schemas.WEBHOOK_ENDPOINT,
        request=schemas.WEBHOOK_ENDPOINT_UPDATE,
        operation_id="webhook_endpoints_update",
    )
    def post(self, request: Any, endpoint_id: str) -> Response:
        endpoint = webhook_endpoint_get_for_org(org=request.user.org, endpoint_id=endpoint_id)
        changes = _body(request, UPDATABLE_FIELDS)
        return Response(
            endpoint_payload(webhook_endpoint_update(endpoint=endpoint, changes=changes))
        )

    @oa.operation(schemas.WEBHOOK_ENDPOINT_DELETED)
    def delete(self, request: Any, endpoint_id: str) -> Response:
        endpoint = webhook_endpoint_get_for_org(org=request.user.org, endpoint_id=endpoint_id)
        webhook_endpoint_delete(endpoint=endpoint)
        return Response(deleted_payload(endpoint_id))


class WebhookEndpointRotateSecretView(APIView):
    scopes = {"POST": WRITE}

    @oa.operation(
        schemas.WEBHOOK_ENDPOINT_WITH_SECRET,
        request=schemas.WEBHOOK_ROTATE_SECRET,
        operation_id="webhook_endpoints_rotate_secret",
    )
    def post(self, request: Any, endpoint_id: str) -> Response:
        endpoint = webhook_endpoint_get_for_org(org=request.user.org, endpoint_id=endpoint_id)
        body = _body(request, ("keep_old_secret_active_for_24_hours",))
        endpoint, secret = webhook_endpoint_rotate_secret(
            endpoint=endpoint,
            keep_old_secret_active_for_24_hours=body.get(
                "keep_old_secret_active_for_24_hours", False
            ),
        )
        return Response(endpoint_payload(endpoint, secret=secret))


class WebhookEndpointTestView(APIView):
    scopes = {"POST": WRITE}

    @oa.operation(
        schemas.WEBHOOK_ENDPOINT_TEST_RESULT,
        request=schemas.WEBHOOK_TEST,
        operation_id="webhook_endpoints_test",
    )
    def post(self, request: Any, endpoint_id: str) -> Response:
        endpoint = webhook_endpoint_get_for_org(org=request.user.org, endpoint_id=endpoint_id)
        event_type, status = webhook_endpoint_test(
            endpoint=endpoint, event_type=_body(request, ("event_type",)).get("event_type")
        )
        return Response(endpoint_test_payload(endpoint, event_type=event_type, status=status))


class WebhookEventTypeListView(APIView):
    scopes = {"GET": READ}

    @oa.operation(schemas.WEBHOOK_EVENT_TYPE_LIST, operation_id="webhook_event_types_list")
    def get(self, request: Any) -> Response:
        return Response(list_envelope(EVENT_TYPES))
