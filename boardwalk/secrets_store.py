"""Secrets for the embedded default, generated once into the data directory.

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


def load_or_create(data_dir: Path) -> dict[str, str]:
    path = data_dir / "secrets.json"
    if path.exists():
        return json.loads(path.read_text())
    data_dir.mkdir(parents=True, exist_ok=True)
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
