"""Production configuration fails loudly; the embedded default keeps its data private."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings as live

from files.storage import content_store

ROOT = Path(__file__).resolve().parents[2]
SECRETS = ("DJANGO_SECRET_KEY", "BOARDWALK_MASTER_KEYS", "BOARDWALK_API_KEY_PEPPER")
PRODUCTION_SWITCHES = ("DATABASE_URL", "REDIS_URL", "BOARDWALK_S3_BUCKET")

# The production settings docs/DEPLOYMENT.md documents (values are examples).
DOCUMENTED_PRODUCTION = {
    "DATABASE_URL": "postgres://boardwalk@db.internal:5432/boardwalk",
    "REDIS_URL": "redis://redis.internal:6379/0",
    "BOARDWALK_S3_BUCKET": "boardwalk-content",
    "DJANGO_SECRET_KEY": "x7Rk2pQ9vLm4Zt8Wn3Yb6Jc1Hd5Fg0Se_Ua-Vi7Ko2Mp9Nq4Lr8Ts3Xw6Ey1Az5Bc",
    "BOARDWALK_MASTER_KEYS": "k1:" + "A" * 43 + "=",
    "BOARDWALK_API_KEY_PEPPER": "pepper-" + "p" * 40,
    "ALLOWED_HOSTS": "api.example.com",
    "BOARDWALK_HTTPS": "1",
    "DEBUG": "0",
}


def _manage(*args: str, env: dict[str, str], data_dir: Path) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in SECRETS + PRODUCTION_SWITCHES and not k.startswith("DJANGO_SETTINGS")
    }
    clean.update(BOARDWALK_DATA_DIR=str(data_dir), **env)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("switch", PRODUCTION_SWITCHES)
def test_production_without_secrets_stops_naming_each_variable(tmp_path: Path, switch: str):
    value = DOCUMENTED_PRODUCTION[switch]
    result = _manage("check", env={switch: value}, data_dir=tmp_path / "var")
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    for name in SECRETS:
        assert name in result.stderr
    # Nothing was invented on disk.
    assert not (tmp_path / "var" / "secrets.json").exists()


def test_production_with_one_secret_missing_names_only_that_one(tmp_path: Path):
    env = {k: v for k, v in DOCUMENTED_PRODUCTION.items() if k != "BOARDWALK_API_KEY_PEPPER"}
    result = _manage("check", env=env, data_dir=tmp_path / "var")
    assert result.returncode != 0
    assert "BOARDWALK_API_KEY_PEPPER" in result.stderr
    assert "BOARDWALK_MASTER_KEYS" not in result.stderr.split("ImproperlyConfigured")[-1]


def test_check_deploy_is_clean_with_the_documented_production_settings(tmp_path: Path):
    result = _manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        env=DOCUMENTED_PRODUCTION,
        data_dir=tmp_path / "var",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_embedded_default_creates_its_data_private(tmp_path: Path):
    data_dir = tmp_path / "var"
    result = _manage("check", env={}, data_dir=data_dir)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((data_dir / "secrets.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((data_dir / "boardwalk.sqlite3").stat().st_mode) == 0o600


def test_content_directories_are_private(settings, tmp_path: Path):
    if not live.S3_BUCKET:
        assert live.CONTENT_STORAGE["OPTIONS"]["directory_permissions_mode"] == 0o700
    settings.STORAGES = {
        **settings.STORAGES,
        "content": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {
                "location": str(tmp_path / "deep" / "content"),
                "file_permissions_mode": 0o600,
                "directory_permissions_mode": 0o700,
            },
        },
    }
    store = content_store()
    writer = store.open_writer()
    writer.write(b"sealed bytes")
    writer.commit("ab/cd/blob")
    root = tmp_path / "deep" / "content"
    for directory in (root, root / "ab", root / "ab" / "cd", root / ".incoming"):
        if directory.exists():
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert stat.S_IMODE((root / "ab" / "cd" / "blob").stat().st_mode) == 0o600


ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("boardwalk", "files", "batches", "billing", "inference", "webhooks", "console")


def test_every_variable_settings_reads_is_in_env_example():
    read = set(
        re.findall(
            r'"((?:BOARDWALK|DJANGO)_[A-Z0-9_]+)"', (ROOT / "project/settings.py").read_text()
        )
    )
    listed = set(re.findall(r"^#? ?([A-Z][A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.M))
    assert read - listed == set()


def test_no_product_module_reads_the_environment_but_settings():
    # project/settings.py reads every variable; boardwalk/env.py is its reader.
    readers = re.compile(
        r"os\.environ(?:\.get)?\s*[\[(]\s*[\"']BOARDWALK_|\benv_(?:int|float|str|bool|list|path)\("
    )
    found = [
        str(path.relative_to(ROOT))
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
        if path.name != "env.py" and readers.search(path.read_text())
    ]
    assert found == []
