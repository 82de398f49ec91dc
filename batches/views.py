from __future__ import annotations

from typing import Any

from rest_framework.response import Response
from rest_framework.views import APIView

from batches import schemas
from batches.idempotency import check_key, request_hash
from batches.requests import parse_submission
from batches.selectors import (
    batch_get_for_org,
    batches_page,
    receipt_get_for_org,
    receipts_page,
)
from batches.serializers import batch_payload, receipt_payload
from batches.services import batch_cancel, batch_create, batch_estimate
from boardwalk.auth import READ, WRITE
from boardwalk.http import openapi as oa
from boardwalk.http.pagination import list_envelope, parse_limit


class BatchCollectionView(APIView):
    scopes = {"POST": WRITE, "GET": READ}

    @oa.operation(
        schemas.BATCH,
        errors=(402, 409, 429, 503),
        request=schemas.BATCH_CREATE,
        parameters=[oa.IDEMPOTENCY_KEY],
    )
    def post(self, request: Any) -> Response:
        key = check_key(request.headers.get("Idempotency-Key"))
        submission = parse_submission(request.data)
        batch = batch_create(
            org=request.user.org,
            submission=submission,
            idempotency_key=key,
            request_digest=request_hash(request.data),
        )
        return Response(batch_payload(batch))

    @oa.operation(oa.list_of(schemas.BATCH), operation_id="batches_list", parameters=oa.PAGINATION)
    def get(self, request: Any) -> Response:
        limit = parse_limit(request.query_params.get("limit"))
        rows, has_more = batches_page(
            org=request.user.org, limit=limit, after=request.query_params.get("after")
        )
        return Response(list_envelope([batch_payload(b) for b in rows], has_more=has_more))


class BatchEstimateView(APIView):
    scopes = {"POST": READ}

    @oa.operation(schemas.ESTIMATE, errors=(503,), request=schemas.BATCH_CREATE)
    def post(self, request: Any) -> Response:
        return Response(
            batch_estimate(org=request.user.org, submission=parse_submission(request.data))
        )


class BatchDetailView(APIView):
    scopes = {"GET": READ}

    @oa.operation(schemas.BATCH)
    def get(self, request: Any, batch_id: str) -> Response:
        return Response(batch_payload(batch_get_for_org(org=request.user.org, batch_id=batch_id)))


class BatchCancelView(APIView):
    scopes = {"POST": WRITE}

    @oa.operation(schemas.BATCH, errors=(409,), request=None)
    def post(self, request: Any, batch_id: str) -> Response:
        batch = batch_get_for_org(org=request.user.org, batch_id=batch_id)
        return Response(batch_payload(batch_cancel(batch=batch)))


class ReceiptListView(APIView):
    scopes = {"GET": READ}

    @oa.operation(
        oa.list_of(schemas.RECEIPT),
        operation_id="requests_list",
        parameters=[*oa.PAGINATION, oa.OpenApiParameter("batch_id", str)],
    )
    def get(self, request: Any) -> Response:
        limit = parse_limit(request.query_params.get("limit"))
        rows, has_more = receipts_page(
            org=request.user.org,
            batch_id=request.query_params.get("batch_id"),
            limit=limit,
            after=request.query_params.get("after"),
        )
        return Response(list_envelope([receipt_payload(i) for i in rows], has_more=has_more))


class ReceiptDetailView(APIView):
    scopes = {"GET": READ}

    @oa.operation(schemas.RECEIPT)
    def get(self, request: Any, request_id: str) -> Response:
        return Response(
            receipt_payload(receipt_get_for_org(org=request.user.org, request_id=request_id))
        )
