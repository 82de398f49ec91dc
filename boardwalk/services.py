"""Writes for organizations and API keys; the admin and management commands call these too."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from boardwalk import clock
from boardwalk.codes import ErrorCode
from boardwalk.errors import InvalidRequest
from boardwalk.models import ALL_SCOPES, ApiKey, Organization

KEY_PREFIX = "bw_"
LAST_USED_RESOLUTION = dt.timedelta(minutes=1)


@dataclass(frozen=True)
class IssuedKey:
    key: ApiKey
    secret: str  # shown once; never stored


def secret_hash(secret: str) -> str:
    # A dedicated pepper, not SECRET_KEY: rotating Django's key must not void every API key.
    return hmac.new(settings.API_KEY_PEPPER.encode(), secret.encode(), hashlib.sha256).hexdigest()


def parse_scopes(raw: str | list[str]) -> list[str]:
    scopes = [s.strip() for s in raw.split(",")] if isinstance(raw, str) else list(raw)
    scopes = sorted({s for s in scopes if s})
    unknown = [s for s in scopes if s not in ALL_SCOPES]
    if not scopes or unknown:
        raise InvalidRequest(
            f"Scopes must be a non-empty subset of {', '.join(ALL_SCOPES)}; got {raw!r}.",
            code=ErrorCode.INVALID_SCOPES,
        )
    return scopes


def org_create(*, name: str) -> Organization:
    name = name.strip()
    if not name:
        raise InvalidRequest("An organization needs a name.", code=ErrorCode.INVALID_NAME)
    return Organization.objects.create(name=name)


@transaction.atomic
def api_key_create(*, org: Organization, scopes: str | list[str], name: str = "") -> IssuedKey:
    prefix = secrets.token_hex(6)
    secret = f"{KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    key = ApiKey.objects.create(
        org=org,
        name=name,
        prefix=prefix,
        secret_hash=secret_hash(secret),
        scopes=parse_scopes(scopes),
    )
    return IssuedKey(key=key, secret=secret)


def api_key_revoke(*, key: ApiKey) -> None:
    ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=clock.now())


def api_key_authenticate(secret: str) -> ApiKey | None:
    """The active key for `secret`, or None. Constant-time on the hash comparison."""
    if not secret.startswith(KEY_PREFIX):
        return None
    prefix, _, _ = secret[len(KEY_PREFIX) :].partition("_")
    key = ApiKey.objects.select_related("org").filter(prefix=prefix).first()
    if key is None or not hmac.compare_digest(key.secret_hash, secret_hash(secret)):
        return None
    if key.revoked_at is not None:
        return None
    now = clock.now()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        # At most one write a minute per key: enough for staff to spot unused keys.
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key
