"""The content store on an S3-compatible bucket (django-storages): whole objects, ranged
reads, every stored version removed on delete."""

from __future__ import annotations

import contextlib
import logging
import tempfile
from typing import IO, Any

from botocore.exceptions import ClientError
from django.core.exceptions import ImproperlyConfigured
from django.core.files import File as DjangoFile
from storages.backends.s3 import S3Storage
from storages.utils import clean_name

from files.storage.base import BlobWriter, ContentStore

logger = logging.getLogger(__name__)


class _TemporaryBlobWriter:
    """For stores that take a whole object (S3): spool to a temporary file, then upload it."""

    def __init__(self, store: ContentStore) -> None:
        self._store = store
        self._tmp: IO[bytes] | None = tempfile.TemporaryFile()  # noqa: SIM115

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._tmp is None:
            raise ValueError("blob writer already committed or aborted")
        self._tmp.write(data)

    def commit(self, name: str) -> int:
        if self._tmp is None:
            raise ValueError("blob writer already committed or aborted")
        size = self._tmp.tell()
        self._tmp.flush()
        self._store.save(name, self._tmp)
        self.abort()
        return size

    def abort(self) -> None:
        if self._tmp is not None:
            self._tmp.close()
            self._tmp = None


class S3ContentStore:
    def __init__(self, storage: S3Storage) -> None:
        if not storage.file_overwrite:
            raise ImproperlyConfigured("the S3 content storage needs file_overwrite=True")
        if storage.gzip:
            # Compressed objects would break ranged reads by stored offset.
            raise ImproperlyConfigured("the S3 content storage must not gzip (gzip=False)")
        self.storage = storage

    def open_writer(self) -> BlobWriter:
        return _TemporaryBlobWriter(self)

    def save(self, name: str, fileobj: IO[bytes]) -> None:
        fileobj.seek(0)
        saved = self.storage.save(name, DjangoFile(fileobj, name))
        if saved != name:
            raise RuntimeError(f"S3 storage saved {name!r} as {saved!r}")

    def read(self, name: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        # A ranged GET: S3File (storage.open) would download the whole object first.
        key = self._key(name)
        client = self.storage.connection.meta.client
        try:
            response = client.get_object(
                Bucket=self.storage.bucket_name,
                Key=key,
                Range=f"bytes={offset}-{offset + length - 1}",
            )
        except client.exceptions.NoSuchKey:
            raise FileNotFoundError(f"no stored blob {name!r}") from None
        except ClientError as err:
            # Past the end: S3 answers 416 rather than an empty body.
            if err.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""
            raise
        with contextlib.closing(response["Body"]) as body:
            return body.read()

    def copy(self, source: str, name: str) -> None:
        # Server-side: the bytes never come back through this process.
        client = self.storage.connection.meta.client
        try:
            client.copy(
                {"Bucket": self.storage.bucket_name, "Key": self._key(source)},
                self.storage.bucket_name,
                self._key(name),
                Config=self.storage.transfer_config,
            )
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                raise FileNotFoundError(f"no stored blob {source!r}") from None
            raise

    def delete(self, name: str) -> None:
        """Delete every version of the key and its delete markers, not just the latest.

        On a versioned bucket a plain DELETE only hides the object behind a delete marker:
        the ciphertext would stay stored. Needs s3:ListBucketVersions and
        s3:DeleteObjectVersion; without them only the current version goes (logged).
        """
        key = self._key(name)
        client = self.storage.connection.meta.client
        bucket = self.storage.bucket_name
        try:
            versions = self._versions(client, key)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") != "AccessDenied":
                raise
            logger.warning(
                "no permission to list object versions in bucket %s: deleting only the "
                "current version of %s",
                bucket,
                key,
            )
            client.delete_object(Bucket=bucket, Key=key)
            return
        if not versions:
            client.delete_object(Bucket=bucket, Key=key)
            return
        for start in range(0, len(versions), 1000):  # DeleteObjects takes 1,000 at most
            batch = versions[start : start + 1000]
            response = client.delete_objects(
                Bucket=bucket,
                Delete={
                    "Objects": [{"Key": key, "VersionId": version} for version in batch],
                    "Quiet": True,
                },
            )
            errors = response.get("Errors") or []
            if errors:
                first = errors[0]
                raise OSError(
                    f"S3 refused to delete {len(errors)} version(s) of {key}: "
                    f"{first.get('Code')} {first.get('Message')}"
                )

    def _versions(self, client: Any, key: str) -> list[str]:
        """Version ids of `key` itself (not of keys it prefixes), delete markers included."""
        versions: list[str] = []
        paginator = client.get_paginator("list_object_versions")
        for page in paginator.paginate(Bucket=self.storage.bucket_name, Prefix=key):
            for entry in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
                if entry["Key"] == key:
                    versions.append(entry["VersionId"])
        return versions

    def exists(self, name: str) -> bool:
        return self.storage.exists(name)

    def size(self, name: str) -> int:
        return self.storage.size(name)

    def discard_abandoned(self, before: float) -> int:
        return 0  # S3 writers stage in local temporary files, which die with their process

    def _key(self, name: str) -> str:
        return self.storage._normalize_name(clean_name(name))
