"""The content store: encrypted blobs by name, on the `content` storage of settings.STORAGES.

Only ciphertext ever reaches the store (see files.crypto). Reads are ranged so that serving a
byte range of a large file fetches only the chunks covering it. A local directory (local.py)
or an S3-compatible bucket (s3.py); uploads reach either through an EncryptedSpool (spool.py).
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.core.files.storage import FileSystemStorage, Storage, storages
from storages.backends.s3 import S3Storage

from files.storage.base import BlobWriter, ContentStore
from files.storage.local import FileSystemContentStore
from files.storage.s3 import S3ContentStore
from files.storage.spool import EncryptedSpool, open_plaintext_range

__all__ = [
    "BlobWriter",
    "ContentStore",
    "EncryptedSpool",
    "FileSystemContentStore",
    "S3ContentStore",
    "content_store",
    "open_plaintext_range",
]


def content_store() -> ContentStore:
    """The store over the current settings.STORAGES["content"]."""
    storage: Storage = storages["content"]
    if isinstance(storage, FileSystemStorage):
        return FileSystemContentStore(storage)
    if isinstance(storage, S3Storage):
        return S3ContentStore(storage)
    raise ImproperlyConfigured(
        f"STORAGES['content'] must be a FileSystemStorage or S3Storage, not {type(storage)}"
    )
