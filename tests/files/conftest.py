"""A real S3-compatible endpoint for content-store tests: moto's server on a localhost port."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest


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
