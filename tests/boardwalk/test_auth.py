from __future__ import annotations

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.views import APIView

from boardwalk.models import ApiKey
from boardwalk.services import api_key_create, api_key_revoke, secret_hash
from tests.conftest import Api, Tenant


def _api_views() -> list[tuple[str, type[APIView]]]:
    found = []

    def walk(patterns, prefix=""):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern):
                view_class = getattr(pattern.callback, "view_class", None)
                if view_class is not None and issubclass(view_class, APIView):
                    found.append((prefix + str(pattern.pattern), view_class))

    walk(get_resolver().url_patterns)
    return found


def test_every_api_view_declares_a_scope_for_each_method_it_serves():
    views = _api_views()
    assert len(views) >= 10
    for route, view in views:
        scopes = getattr(view, "scopes", None)
        assert scopes, f"{route} declares no scopes"
        served = {m for m in ("get", "post", "delete", "put", "patch") if m in vars(view)}
        undeclared = {m.upper() for m in served} - set(scopes)
        assert not undeclared, f"{route} serves {undeclared} without declaring a scope"


@pytest.mark.django_db
def test_missing_key_is_401_in_the_envelope(api: Api):
    response = api.get("/v1/models", key="")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "missing_api_key"
    assert response.headers["x-should-retry"] == "false"


@pytest.mark.django_db
@pytest.mark.parametrize("header", ["Bearer bw_nope_nope", "Bearer ", "Basic abc", "Bearer bw_"])
def test_invalid_key_is_401(api: Api, header: str):
    response = api.client.get("/v1/models", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"


@pytest.mark.django_db
def test_revoked_key_is_401(tenant: Tenant):
    key = ApiKey.objects.get(secret_hash=secret_hash(tenant.write_key))
    api_key_revoke(key=key)
    response = tenant.api.get("/v1/models")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.django_db
def test_key_is_stored_only_as_prefix_and_hash(tenant: Tenant):
    issued = api_key_create(org=tenant.org, scopes=["requests:read"])
    stored = ApiKey.objects.get(pk=issued.key.pk)
    assert issued.secret not in (stored.prefix, stored.secret_hash, stored.name)
    assert stored.secret_hash == secret_hash(issued.secret)


@pytest.mark.django_db
def test_read_key_cannot_write(tenant: Tenant, uploaded: dict):
    for method, path in [
        ("post", "/v1/files"),
        ("delete", f"/v1/files/{uploaded['id']}"),
        ("post", "/v1/batches"),
        ("post", "/v1/batches/batch_x/cancel"),
    ]:
        response = getattr(tenant.api, method)(path, key=tenant.read_key)
        assert response.status_code == 403, (method, path)
        assert response.json()["error"]["code"] == "insufficient_scope"


@pytest.mark.django_db
def test_read_key_can_read(tenant: Tenant, uploaded: dict):
    assert tenant.api.get(f"/v1/files/{uploaded['id']}", key=tenant.read_key).status_code == 200
    assert (
        tenant.api.get(f"/v1/files/{uploaded['id']}/content", key=tenant.read_key).status_code
        == 200
    )
    assert tenant.api.get("/v1/models", key=tenant.read_key).status_code == 200
    assert tenant.api.get("/v1/batches", key=tenant.read_key).status_code == 200


@pytest.mark.django_db
def test_unknown_path_and_method_answer_in_the_envelope(api: Api):
    response = api.get("/v1/nope")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    response = api.get("/v1/files")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"
    response = api.client.put("/v1/models", HTTP_AUTHORIZATION=f"Bearer {api.key}")
    assert response.status_code == 405
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.django_db
def test_healthz(client):
    assert client.get("/healthz").json() == {"status": "ok"}
