from __future__ import annotations

from typing import Any

from boardwalk.clock import unix
from files.models import File


def file_payload(file: File) -> dict[str, Any]:
    return {
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "filename": file.filename,
        "purpose": file.purpose,
        "status": file.status,
        "created_at": unix(file.created_at),
        "expires_at": unix(file.expires_at),
        "status_details": None,
    }
