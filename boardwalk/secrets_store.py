"""Secrets for the embedded default, generated once into the data directory (0700).

Production passes BOARDWALK_MASTER_KEYS and BOARDWALK_API_KEY_PEPPER in the environment and
never touches this file. The embedded mode must work with zero configuration, yet must not
ship a fixed key in the repository, so the first start writes random ones (mode 0600).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from pathlib import Path


def private_dir(path: Path) -> None:
    """Create `path` (and missing parents) for this user only (0700); an existing one is kept."""
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)  # mkdir's mode goes through the umask


def private_file(path: Path) -> None:
    """Create `path` empty with mode 0600 unless it exists; tighten an existing one of ours."""
    private_dir(path.parent)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        info = path.stat()
        if info.st_mode & 0o077 and info.st_uid == os.getuid():
            path.chmod(0o600)


def load_or_create(data_dir: Path) -> dict[str, str]:
    path = data_dir / "secrets.json"
    if path.exists():
        return json.loads(path.read_text())
    private_dir(data_dir)
    values = {
        "master_keys": "k1:" + base64.b64encode(secrets.token_bytes(32)).decode(),
        "api_key_pepper": secrets.token_urlsafe(32),
        "django_secret_key": secrets.token_urlsafe(50),
    }
    # Write aside, then link into place: link() fails if the file exists, so two processes
    # starting at once agree on one set of secrets and neither reads a half-written file.
    tmp = data_dir / f".secrets.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(values, handle)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return json.loads(path.read_text())
    finally:
        tmp.unlink()
    return values
