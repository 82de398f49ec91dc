"""The one way Boardwalk makes HTTP requests to addresses a customer chose
(docs/API.md "Limits, retention and privacy").

Webhook deliveries and image fetches go through `request()` only. Rules:

- `https` only, to public addresses only: Microsoft's AntiSSRF session resolves the name,
  refuses if *any* address is loopback, private, link-local, metadata, unspecified, IPv4-mapped
  into those, or otherwise reserved, and then connects to the address it checked (so a DNS
  answer that changes between check and connect cannot redirect the socket);
- redirects are followed by hand, each hop checked again from scratch;
- the answer is read in small pieces against a byte cap and a monotonic deadline (the library
  has neither), with `Accept-Encoding: identity` so a compressed bomb cannot expand past the
  cap;
- `BOARDWALK_OUTBOUND_ALLOW=host:port,...` names targets that skip the address rules (tests,
  private networks), over `http` as well as `https`. Nothing else does.

No proxy from the environment is used, and no `X-Forwarded-For` is added.
"""

from __future__ import annotations

import time
import unicodedata
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import requests
from AntiSSRF import AntiSSRFError, AntiSSRFPolicy, PolicyConfigOptions
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

DEFAULT_MAX_BYTES = 1024 * 1024
DEFAULT_TIMEOUT_SECONDS = 10.0
DEFAULT_MAX_REDIRECTS = 3
_READ_PIECE = 64 * 1024
_USER_AGENT = "Boardwalk/1 (+outbound)"
# WHATWG's forbidden host code points (whitespace and controls are refused in the whole URL):
# a host holding one is not the host a client would connect to.
_FORBIDDEN_IN_HOST = frozenset("#%/:<>?@[\\]^|")


class OutboundError(Exception):
    """The request did not produce an answer. `reason` is a short code, safe to store."""

    reason = "failed"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class OutboundRefused(OutboundError):
    """The target is not allowed (scheme or address); nothing was sent."""

    reason = "refused"


@dataclass(frozen=True)
class OutboundResponse:
    status: int
    url: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def allowed_targets() -> frozenset[tuple[str, int]]:
    """`BOARDWALK_OUTBOUND_ALLOW` parsed; a malformed entry is a configuration error."""
    targets = set()
    for entry in settings.OUTBOUND_ALLOW:
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ImproperlyConfigured(
                f"BOARDWALK_OUTBOUND_ALLOW entries are host:port, got {entry!r}"
            )
        targets.add((host.strip("[]").lower(), int(port)))
    return frozenset(targets)


def parse_target(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL Boardwalk may be asked to send to; OutboundRefused
    (`bad_url`) for one it must not: the upload of an image URL and the creation of a
    webhook refuse with this rule, and each request is checked by it again."""
    # urlsplit drops tabs and newlines and keeps spaces and NULs, so "https://exam\tple.com/"
    # would be checked as one host and sent to another: such a URL is refused whole.
    if any(ch.isspace() or unicodedata.category(ch).startswith("C") for ch in url):
        raise OutboundRefused(
            "the URL holds whitespace or control characters (percent-encode them)",
            reason="bad_url",
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise OutboundRefused(f"malformed URL: {exc}", reason="bad_url") from exc
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if scheme not in ("http", "https") or not host:
        raise OutboundRefused("only http(s) URLs with a host are allowed", reason="bad_url")
    # (An IPv6 literal is the one host with colons; urlsplit took off its brackets.)
    if ":" not in host and _FORBIDDEN_IN_HOST.intersection(host):
        raise OutboundRefused("the host holds characters a host cannot hold", reason="bad_url")
    if parts.username or parts.password:
        raise OutboundRefused("URLs with credentials are not allowed", reason="bad_url")
    return scheme, host, port or (443 if scheme == "https" else 80)


def _session_for(url: str) -> requests.Session:
    scheme, host, port = parse_target(url)
    if (host, port) in allowed_targets():
        session = requests.Session()  # named by the operator: no address rules
    else:
        if scheme != "https":
            raise OutboundRefused("only https URLs are allowed", reason="not_https")
        policy = AntiSSRFPolicy(PolicyConfigOptions.EXTERNAL_ONLY_LATEST)
        policy.add_xff_header = False
        session = policy.get_antissrf_session()
    session.trust_env = False  # never a proxy or .netrc from the environment
    if settings.OUTBOUND_CA_BUNDLE:
        session.verify = settings.OUTBOUND_CA_BUNDLE
    return session


def request(
    method: str,
    url: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    max_redirects: int = DEFAULT_MAX_REDIRECTS,
) -> OutboundResponse:
    """Send one request under the outbound rules; raise OutboundError if there is no answer.

    A 3xx is followed (GET/HEAD only; other methods get the 3xx back as the answer), each hop
    re-checked. The whole exchange, redirects included, ends by `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    for _ in range(max_redirects + 1):
        answer = _send(method, url, body, headers or {}, max_bytes, deadline)
        location = answer.headers.get("location")
        if answer.status in (301, 302, 303, 307, 308) and location and method in ("GET", "HEAD"):
            url = urljoin(url, location)
            continue
        return answer
    raise OutboundError("too many redirects", reason="too_many_redirects")


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise OutboundError("total time limit reached", reason="timeout")
    return left


def _send(
    method: str,
    url: str,
    body: bytes | None,
    headers: dict[str, str],
    max_bytes: int,
    deadline: float,
) -> OutboundResponse:
    session = _session_for(url)
    sent_headers = {"User-Agent": _USER_AGENT, **headers, "Accept-Encoding": "identity"}
    try:
        left = _remaining(deadline)
        with (
            session,
            session.request(
                method,
                url,
                data=body,
                headers=sent_headers,
                allow_redirects=False,
                stream=True,
                timeout=(left, left),
            ) as response,
        ):
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise OutboundError("answer larger than allowed", reason="too_large")
            pieces: list[bytes] = []
            size = 0
            while True:
                _remaining(deadline)
                piece = response.raw.read1(_READ_PIECE)
                if not piece:
                    break
                size += len(piece)
                if size > max_bytes:
                    raise OutboundError("answer larger than allowed", reason="too_large")
                pieces.append(piece)
            return OutboundResponse(
                status=response.status_code,
                url=url,
                body=b"".join(pieces),
                headers={k.lower(): v for k, v in response.headers.items()},
            )
    except AntiSSRFError as exc:
        raise OutboundRefused(
            "the target resolves to an address that is not public", reason="not_public"
        ) from exc
    except requests.Timeout as exc:
        raise OutboundError("timed out", reason="timeout") from exc
    except (requests.RequestException, OSError) as exc:
        # Includes DNS failures (socket.gaierror raised while AntiSSRF resolves).
        cause = exc.__context__ or exc
        if isinstance(cause, AntiSSRFError):
            raise OutboundRefused(
                "the target resolves to an address that is not public", reason="not_public"
            ) from exc
        raise OutboundError(f"connection failed: {type(exc).__name__}", reason="connect") from exc
