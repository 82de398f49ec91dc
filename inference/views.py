from __future__ import annotations

from typing import Any

from rest_framework.response import Response
from rest_framework.views import APIView

from boardwalk.auth import READ
from boardwalk.http import openapi as oa
from boardwalk.http.pagination import list_envelope
from inference import schemas
from inference.selectors import model_get_for_org, models_for_org
from inference.serializers import model_payload


class ModelListView(APIView):
    scopes = {"GET": READ}

    @oa.operation(oa.list_of(schemas.MODEL), operation_id="models_list")
    def get(self, request: Any) -> Response:
        data = [model_payload(m) for m in models_for_org(org=request.user.org)]
        return Response(list_envelope(data, has_more=False))


class ModelDetailView(APIView):
    scopes = {"GET": READ}

    @oa.operation(schemas.MODEL)
    def get(self, request: Any, name: str) -> Response:
        return Response(model_payload(model_get_for_org(org=request.user.org, name=name)))
