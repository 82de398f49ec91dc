"""Where an external revision's rows go: its server's base URL, its model id there, and the
API key, read from the environment variable the revision names (never stored).

The URL is the OpenAI-compatible base, `/v1` included (`http://vllm-head:8000/v1`): the
client asks `{url}/models` and posts to `{url}/chat/completions`. It is chosen by staff with
`manage.py model add`, usually a private address inside the cluster, so it does not go through
`boardwalk.outbound` (public addresses only, for customer-chosen URLs). Credentials in the URL
are refused, since the URL is stored in the database; the key comes from the process's
environment, under a name that is none of Boardwalk's own settings (a typo must not send
`BOARDWALK_MASTER_KEYS` to an upstream).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "Upstream",
    "UpstreamConfigError",
    "api_key_env_refusal",
    "api_key_from_environment",
    "normalized_url",
]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Names Boardwalk's own configuration uses (project/settings.py, .env.example): never a key
# to hand to someone else's server.
_RESERVED = re.compile(r"(BOARDWALK_|DJANGO_|AWS_|DATABASE_URL\Z|REDIS_URL\Z)", re.IGNORECASE)
# llm-d's batch gateway gives a request 5 minutes.
REQUEST_TIMEOUT_SECONDS = 300.0
CONNECT_TIMEOUT_SECONDS = 10.0


class UpstreamConfigError(ValueError):
    """The revision's upstream cannot be used as configured; the message says what to change."""


def normalized_url(url: str) -> str:
    """`url` without a trailing slash, or UpstreamConfigError saying what is wrong with it."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UpstreamConfigError(
            f"--engine-url {url!r} is not an http(s) URL; give the server's OpenAI base, "
            "e.g. http://vllm-head:8000/v1"
        )
    if parts.username or parts.password:
        raise UpstreamConfigError(
            "--engine-url must not carry credentials (it is stored in the database): put the "
            "key in an environment variable and name it with --engine-api-key-env"
        )
    if parts.query or parts.fragment:
        raise UpstreamConfigError(f"--engine-url {url!r} must have no query or fragment")
    return url.strip().rstrip("/")


def api_key_env_refusal(name: str) -> str | None:
    """Why `name` cannot name the upstream's API key variable, or None."""
    if not _ENV_NAME.match(name):
        return f"--engine-api-key-env {name!r} is not an environment variable name"
    if _RESERVED.match(name):
        return (
            f"--engine-api-key-env {name!r} is one of Boardwalk's own settings; name a "
            "variable that holds only the upstream's key"
        )
    return None


def api_key_from_environment(name: str) -> str | None:
    """The key in variable `name` (None when the revision names none); UpstreamConfigError
    when it is named but unset or empty in this process's environment."""
    if not name:
        return None
    refused = api_key_env_refusal(name)
    if refused:
        raise UpstreamConfigError(refused)
    value = os.environ.get(name, "")
    if not value:
        raise UpstreamConfigError(
            f"the upstream's API key variable {name} is not set in this process's environment "
            "(set it for the web and worker processes)"
        )
    return value


@dataclass(frozen=True)
class Upstream:
    """One external engine: base URL, model id there, key (kept out of reprs and logs)."""

    url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS
    request_timeout: float = REQUEST_TIMEOUT_SECONDS

    def headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": "application/json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers

    @classmethod
    def of(cls, revision: Any, **timeouts: float) -> Upstream:
        """The upstream of an external `ModelRevision` (its key read from the environment).
        `timeouts`: `connect_timeout` and `request_timeout`, where not the defaults."""
        if not revision.engine_url:
            raise UpstreamConfigError(f"revision {revision.id} runs on Boardwalk's own engine")
        return cls(
            url=normalized_url(revision.engine_url),
            model=revision.engine_model,
            api_key=api_key_from_environment(revision.engine_api_key_env),
            **timeouts,
        )
