"""Shared fixtures: organizations with keys, the tiny demo model, and an API helper."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.conf import settings as django_settings
from rest_framework.test import APIClient

from billing.services import credit_grant
from boardwalk.broker import setup_broker
from boardwalk.models import Organization
from boardwalk.services import api_key_create, org_create
from inference.demo.model import build_demo_model, demo_revision_fields
from inference.demo.multimodal import (
    audio_revision_fields,
    build_audio_model,
    build_vision_model,
    vision_revision_fields,
)
from inference.models import CatalogModel, Deployment
from inference.services import catalog_model_create, deployment_create, revision_create

ROOT = Path(__file__).resolve().parent.parent
PRICES = (150_000, 75_000, 600_000)
# Interactive prices (≥ the batch ones, which flex pays): tests see money on every path.
INTERACTIVE_PRICES = (300_000, 150_000, 1_200_000)
GPU_SECOND_PRICE = 400

postgres_only = pytest.mark.skipif(
    not django_settings.IS_POSTGRES, reason="needs PostgreSQL (set DATABASE_URL)"
)
redis_only = pytest.mark.skipif(not django_settings.REDIS_URL, reason="needs Redis (set REDIS_URL)")


@pytest.fixture(autouse=True)
def _engine_in_process(settings: Any) -> None:
    """Tests run the engine inside the test process (each test's revision would otherwise
    start its own engine process); tests/inference/test_engine_process.py covers that one."""
    settings.ENGINE_PROCESS = False


@pytest.fixture(autouse=True)
def _content_in_tmp(settings: Any, tmp_path: Path) -> None:
    """Each test stores its encrypted blobs in its own folder."""
    settings.STORAGES = {
        **settings.STORAGES,
        "content": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {
                "location": str(tmp_path / "content"),
                "file_permissions_mode": 0o600,
                "directory_permissions_mode": 0o700,
            },
        },
    }


@pytest.fixture(scope="session", autouse=True)
def _no_session_left_on_the_test_database(django_db_setup: None, django_db_blocker: Any):
    """PostgreSQL refuses to drop a database someone is connected to. Threads of this
    process that outlive their test (a daemon still holding its thread's connection) would
    fail the whole run at its very end: before the test database goes, their sessions are
    ended, and named on stderr so that the next person can find the thread."""
    yield
    if not django_settings.IS_POSTGRES:
        return
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, application_name, state, backend_start, left(query, 80) "
            "FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        left = cursor.fetchall()
        for row in left:
            cursor.execute("SELECT pg_terminate_backend(%s)", [row[0]])
    for row in left:
        print(f"session left on the test database, ended: {row}", file=sys.stderr)


@pytest.fixture(scope="session", autouse=True)
def _fresh_broker() -> None:
    """Start from empty queues: messages left by an earlier run name rows that are gone."""
    if django_settings.REDIS_URL:
        setup_broker().flush_all()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("models") / "tiny-chat-tiny", size="tiny")


@pytest.fixture(scope="session")
def vision_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_vision_model(tmp_path_factory.mktemp("models") / "tiny-vision")


@pytest.fixture(scope="session")
def audio_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_audio_model(tmp_path_factory.mktemp("models") / "tiny-audio")


@dataclass
class Api:
    """Small request helpers; `key` defaults to the fixture org's write key."""

    client: APIClient
    key: str | None

    def _auth(self, key: str | None) -> dict[str, str]:
        key = self.key if key is None else key
        return {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}

    def get(self, path: str, *, key: str | None = None, **headers: str) -> Any:
        return self.client.get(path, **self._auth(key), **headers)

    def delete(self, path: str, *, key: str | None = None) -> Any:
        return self.client.delete(path, **self._auth(key))

    def post(self, path: str, body: Any = None, *, key: str | None = None, **headers: str) -> Any:
        data = b"" if body is None else orjson.dumps(body)
        return self.client.generic(
            "POST", path, data, content_type="application/json", **self._auth(key), **headers
        )

    def upload(
        self,
        content: bytes,
        *,
        key: str | None = None,
        purpose: str | None = "batch",
        extra: dict[str, str] | None = None,
    ) -> Any:
        data: dict[str, Any] = {"file": io.BytesIO(content)}
        data["file"].name = "requests.jsonl"
        if purpose is not None:
            data["purpose"] = purpose
        data.update(extra or {})
        return self.client.post("/v1/files", data, format="multipart", **self._auth(key))


@dataclass
class Tenant:
    org: Organization
    write_key: str
    read_key: str
    api: Api


def make_tenant(name: str, *, credit: int = 10_000_000_000) -> Tenant:
    org = org_create(name=name)
    write = api_key_create(org=org, scopes="inference:write,requests:read").secret
    read = api_key_create(org=org, scopes="requests:read").secret
    if credit:
        credit_grant(org=org, amount_microusd=credit, memo="tests")
    return Tenant(org=org, write_key=write, read_key=read, api=Api(APIClient(), write))


@pytest.fixture
def tenant(db: None) -> Tenant:
    return make_tenant("acme")


@pytest.fixture
def other_tenant(db: None) -> Tenant:
    return make_tenant("globex")


@pytest.fixture
def api(tenant: Tenant) -> Api:
    return tenant.api


@pytest.fixture
def catalog_model(db: None, tiny_model_dir: Path) -> CatalogModel:
    revision = revision_create(**demo_revision_fields(tiny_model_dir, "tiny"))
    return catalog_model_create(
        name="boardwalk/tiny-chat",
        revision=revision,
        prices=PRICES,
        interactive_prices=INTERACTIVE_PRICES,
    )


@pytest.fixture
def vision_model(db: None, vision_model_dir: Path) -> CatalogModel:
    revision = revision_create(**vision_revision_fields(vision_model_dir))
    return catalog_model_create(
        name="boardwalk/tiny-vision",
        revision=revision,
        prices=PRICES,
        media=["image"],
        interactive_prices=INTERACTIVE_PRICES,
    )


@pytest.fixture
def audio_model(db: None, audio_model_dir: Path) -> CatalogModel:
    revision = revision_create(**audio_revision_fields(audio_model_dir))
    return catalog_model_create(
        name="boardwalk/tiny-audio",
        revision=revision,
        prices=PRICES,
        media=["audio"],
        interactive_prices=INTERACTIVE_PRICES,
    )


@pytest.fixture
def deployment(tenant: Tenant, catalog_model: CatalogModel) -> Deployment:
    return deployment_create(
        org=tenant.org,
        name="support-agent",
        revision=catalog_model.revision,
        gpu_second_price=GPU_SECOND_PRICE,
    )


def request_line(
    custom_id: str = "task-1",
    *,
    model: str = "boardwalk/tiny-chat",
    max_tokens: int = 8,
    content: str | list[dict[str, Any]] = "Hello there",
    **body: Any,
) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "max_completion_tokens": max_tokens,
            **body,
        },
    }


def jsonl(*rows: dict[str, Any]) -> bytes:
    return b"".join(orjson.dumps(row) + b"\n" for row in rows)


def parse_jsonl(data: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in data.splitlines() if line]


def content_of(response: Any) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


@pytest.fixture
def uploaded(api: Api, catalog_model: CatalogModel) -> Iterator[dict[str, Any]]:
    response = api.upload(jsonl(request_line("task-1"), request_line("task-2", content="Second")))
    assert response.status_code == 200, response.content
    yield response.json()
