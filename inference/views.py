from __future__ import annotations

from typing import Any

from rest_framework.response import Response
from rest_framework.views import APIView

from boardwalk import openapi as oa
from boardwalk.auth import READ
from inference.selectors import model_get_for_org, models_for_org
from inference.serializers import model_payload


class ModelListView(APIView):
    scopes = {"GET": READ}

    @oa.operation(oa.list_of(oa.MODEL), operation_id="models_list")
    def get(self, request: Any) -> Response:
        data = [model_payload(m) for m in models_for_org(org=request.user.org)]
        return Response(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": False,
            }
        )


class ModelDetailView(APIView):
    scopes = {"GET": READ}

    @oa.operation(oa.MODEL)
    def get(self, request: Any, name: str) -> Response:
        return Response(model_payload(model_get_for_org(org=request.user.org, name=name)))
