"""Content-store fixtures: a real S3-compatible endpoint (moto's server on a localhost port,
with a plain and a versioned bucket) and the same tests run over it and a local directory."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from pytest_django import Settings

from files.storage import ContentStore, content_store


@dataclass(frozen=True)
class S3Endpoint:
    endpoint_url: str
    bucket: str
    access_key: str = "testing"
    secret_key: str = "testing"
    region_name: str = "us-east-1"

    def storage_options(self, *, location: str = "boardwalk") -> dict[str, Any]:
        return {
            "bucket_name": self.bucket,
            "endpoint_url": self.endpoint_url,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "region_name": self.region_name,
            "location": location,
            "file_overwrite": True,
            "default_acl": None,
        }

    def use_for_content(self, settings: Any, *, location: str = "boardwalk") -> None:
        """Point STORAGES["content"] at this endpoint (pytest-django `settings` fixture).

        Assigns a new STORAGES so that Django's setting_changed signal drops the cached
        storage; mutating the dict in place would keep the old one.
        """
        settings.STORAGES = {
            **settings.STORAGES,
            "content": {
                "BACKEND": "storages.backends.s3.S3Storage",
                "OPTIONS": self.storage_options(location=location),
            },
        }

    def client(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region_name,
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_up(url: str, process: subprocess.Popen[bytes], *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):  # noqa: S310 (our own localhost URL)
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    raise RuntimeError(f"moto_server did not answer at {url} within {timeout} s")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[S3Endpoint]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        endpoint = S3Endpoint(endpoint_url=f"http://127.0.0.1:{port}", bucket="boardwalk-test")
        _wait_until_up(endpoint.endpoint_url, process, timeout=30)
        endpoint.client().create_bucket(Bucket=endpoint.bucket)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def s3_versioned_endpoint(s3_endpoint: S3Endpoint) -> S3Endpoint:
    """The same server, another bucket, with versioning on (as DEPLOYMENT.md recommends)."""
    endpoint = S3Endpoint(endpoint_url=s3_endpoint.endpoint_url, bucket="boardwalk-versioned")
    client = endpoint.client()
    client.create_bucket(Bucket=endpoint.bucket)
    client.put_bucket_versioning(
        Bucket=endpoint.bucket, VersioningConfiguration={"Status": "Enabled"}
    )
    return endpoint


@dataclass
class Backend:
    kind: str
    store: ContentStore
    raw: Callable[[str], bytes]
    keys: Callable[[], list[str]]
    # Every stored version of every key, delete markers included (local: same as keys).
    versions: Callable[[], list[str]]
    remove: Callable[[str], None]  # behind the store's back, as a lost object would be
    put: Callable[[str, bytes], None]  # behind the store's back, as damage would be


def use_local_content(settings: Settings, root: Path) -> None:
    settings.STORAGES = {
        **settings.STORAGES,
        "content": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(root), "file_permissions_mode": 0o600},
        },
    }


def _local_backend(settings: Settings, root: Path) -> Backend:
    use_local_content(settings, root)

    def local_keys() -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

    return Backend(
        kind="local",
        store=content_store(),
        raw=lambda name: (root / name).read_bytes(),
        keys=local_keys,
        versions=local_keys,
        remove=lambda name: (root / name).unlink(),
        put=lambda name, data: (root / name).write_bytes(data),
    )


def _s3_backend(kind: str, settings: Settings, endpoint: S3Endpoint) -> Backend:
    # A prefix per test keeps tests apart in the shared bucket.
    location = f"t-{uuid.uuid4().hex}"
    endpoint.use_for_content(settings, location=location)
    client = endpoint.client()
    bucket = endpoint.bucket

    def s3_raw(name: str) -> bytes:
        response = client.get_object(Bucket=bucket, Key=f"{location}/{name}")
        return response["Body"].read()

    def s3_keys() -> list[str]:
        listing = client.list_objects_v2(Bucket=bucket, Prefix=f"{location}/")
        return sorted(
            item["Key"].removeprefix(f"{location}/") for item in listing.get("Contents", [])
        )

    def s3_versions() -> list[str]:
        listing = client.list_object_versions(Bucket=bucket, Prefix=f"{location}/")
        entries = [*listing.get("Versions", []), *listing.get("DeleteMarkers", [])]
        return sorted(entry["Key"].removeprefix(f"{location}/") for entry in entries)

    def s3_remove(name: str) -> None:
        client.delete_object(Bucket=bucket, Key=f"{location}/{name}")

    def s3_put(name: str, data: bytes) -> None:
        client.put_object(Bucket=bucket, Key=f"{location}/{name}", Body=data)

    return Backend(kind, content_store(), s3_raw, s3_keys, s3_versions, s3_remove, s3_put)


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, settings: Settings, tmp_path: Path) -> Backend:
    if request.param == "local":
        return _local_backend(settings, tmp_path / "content")
    return _s3_backend("s3", settings, request.getfixturevalue("s3_endpoint"))


@pytest.fixture(params=["local", "s3", "s3-versioned"])
def any_backend(request: pytest.FixtureRequest, settings: Settings, tmp_path: Path) -> Backend:
    """`backend`, plus an S3 bucket with versioning on."""
    if request.param == "local":
        return _local_backend(settings, tmp_path / "content")
    name = "s3_endpoint" if request.param == "s3" else "s3_versioned_endpoint"
    return _s3_backend(request.param, settings, request.getfixturevalue(name))
