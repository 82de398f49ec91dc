"""The operations interface: exact command names and JSON shapes (issue: foundation §9)."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from billing.selectors import credit_for_org
from boardwalk.models import ApiKey, Organization
from boardwalk.services import api_key_authenticate
from inference.models import CatalogModel, Deployment

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_create_org_and_key_print_json():
    org = json.loads(run("create_org", "Initech", "--json"))
    assert org["name"] == "Initech" and org["org_id"].startswith("org_")
    key = json.loads(
        run("create_api_key", "--org", "Initech", "--scopes", "requests:read", "--json")
    )
    assert key["scopes"] == ["requests:read"]
    assert key["api_key"].startswith("bw_") and key["prefix"] in key["api_key"]
    assert api_key_authenticate(key["api_key"]).org_id == org["org_id"]
    by_id = json.loads(run("create_api_key", "--org", org["org_id"], "--json"))
    assert sorted(by_id["scopes"]) == ["inference:write", "requests:read"]
    assert key["api_key"] not in {k.secret_hash for k in ApiKey.objects.all()}


def test_create_api_key_rejects_unknown_scope_and_org():
    call_command("create_org", "Initech")
    with pytest.raises(CommandError, match="Scopes"):
        run("create_api_key", "--org", "Initech", "--scopes", "admin")
    with pytest.raises(CommandError, match="No organization"):
        run("create_api_key", "--org", "nobody")
    assert not ApiKey.objects.exists()


def test_bootstrap_demo_is_idempotent_and_prints_one_json_line(settings, tmp_path):
    settings.MODELS_DIR = tmp_path / "models"
    first = json.loads(run("bootstrap_demo", "--json"))
    assert set(first) == {
        "org_id",
        "api_key",
        "read_key",
        "model",
        "deployment",
        "vision_model",
        "audio_model",
    }
    second = json.loads(run("bootstrap_demo", "--json"))
    assert second["org_id"] == first["org_id"]
    assert Organization.objects.count() == 1
    assert CatalogModel.objects.filter(name=first["model"]).count() == 1
    # docs/API.md "Images and audio": images and audio can be tried in the demo.
    vision = CatalogModel.objects.get(name=first["vision_model"])
    audio = CatalogModel.objects.get(name=first["audio_model"])
    assert (first["vision_model"], vision.batch_media) == ("boardwalk/tiny-vision", ["image"])
    assert (first["audio_model"], audio.batch_media) == ("boardwalk/tiny-audio", ["audio"])
    assert CatalogModel.objects.count() == 3
    assert Deployment.objects.get(name=first["deployment"]).org_id == first["org_id"]
    assert credit_for_org(org_id=first["org_id"]).balance == 100_000_000  # granted once
    read = api_key_authenticate(first["read_key"])
    assert read.scopes == ["requests:read"]
    assert sorted(api_key_authenticate(first["api_key"]).scopes) == [
        "inference:write",
        "requests:read",
    ]


def test_grant_credit_appends_to_the_ledger():
    call_command("create_org", "Initech")
    out = run("grant_credit", "--org", "Initech", "--microusd", "2500")
    assert "2500" in out
    org = Organization.objects.get(name="Initech")
    assert credit_for_org(org_id=org.id).available == 2500
    with pytest.raises(CommandError):
        run("grant_credit", "--org", "Initech", "--microusd", "0")
