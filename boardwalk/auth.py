"""API key authentication and deny-by-default scope checks
(docs/API.md "Identifiers, keys and scopes").

Every API view declares `scopes`: a mapping from HTTP method to the scopes of which the key
needs at least one. A view that declares nothing is refused, and a test walks the URLconf to
make sure no view forgets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import NotAuthenticated
from rest_framework.permissions import BasePermission

from boardwalk.codes import ErrorCode
from boardwalk.errors import AuthenticationError, ScopeError
from boardwalk.models import SCOPE_READ, SCOPE_WRITE, ApiKey, Organization
from boardwalk.services import api_key_authenticate

WRITE = (SCOPE_WRITE,)
READ = (SCOPE_WRITE, SCOPE_READ)


@dataclass(frozen=True)
class Principal:
    """What `request.user` is for API calls: the key's organization and scopes."""

    org: Organization
    key: ApiKey

    is_authenticated = True
    is_active = True
    is_staff = False

    @property
    def scopes(self) -> list[str]:
        return list(self.key.scopes)


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Any) -> tuple[Principal, ApiKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise AuthenticationError(
                "Malformed Authorization header. Send 'Authorization: Bearer <key>'."
            )
        key = api_key_authenticate(secret.strip())
        if key is None:
            raise AuthenticationError("Invalid or revoked API key.")
        return Principal(org=key.org, key=key), key

    def authenticate_header(self, request: Any) -> str:
        # Makes DRF answer 401 (not 403) when no key is sent.
        return 'Bearer realm="boardwalk"'


class HasDeclaredScope(BasePermission):
    def has_permission(self, request: Any, view: Any) -> bool:
        method = request.method.upper()
        if not hasattr(view, method.lower()) and method != "OPTIONS":
            return True  # let the view answer 405
        declared = getattr(view, "scopes", None)
        if not declared:
            return False  # deny by default: a view must state its scopes
        needed = declared.get(method) or (
            declared.get("GET") if method in ("HEAD", "OPTIONS") else None
        )
        if needed is None:
            return False
        if request.user is None or not getattr(request.user, "is_authenticated", False):
            raise NotAuthenticated()
        if not set(needed) & set(request.user.scopes):
            raise ScopeError(
                f"This API key lacks the scope for {method} {request.path}: "
                f"it needs one of {', '.join(needed)}.",
                code=ErrorCode.INSUFFICIENT_SCOPE,
            )
        return True
