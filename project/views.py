from __future__ import annotations

import hmac
import ipaddress
import logging
import os

import redis
from django.conf import settings
from django.core.files.storage import FileSystemStorage, storages
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse

from boardwalk import metrics
from boardwalk.codes import ErrorCode
from boardwalk.errors import AuthenticationError, ScopeError, ServiceUnavailable, render_plain
from boardwalk.logs import exception_trace

logger = logging.getLogger(__name__)

# A dependency that does not answer within this long counts as down.
READY_TIMEOUT_SECONDS = 2.0


def healthz(request: HttpRequest) -> JsonResponse:
    """200 once the process can reach its database; used by deploy checks and `make run`."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


def _check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _check_broker() -> None:
    if not settings.REDIS_URL:
        return  # embedded: the broker is in this process
    client = redis.Redis.from_url(
        settings.REDIS_URL,
        socket_timeout=READY_TIMEOUT_SECONDS,
        socket_connect_timeout=READY_TIMEOUT_SECONDS,
    )
    try:
        client.ping()
    finally:
        client.close()


def _check_storage() -> None:
    storage = storages["content"]
    if isinstance(storage, FileSystemStorage):
        location = storage.location
        probe = location if os.path.isdir(location) else os.path.dirname(location)
        if not os.access(probe, os.W_OK | os.X_OK):
            raise OSError("content directory not writable")
        return
    storage.exists("readyz-probe")  # one authenticated request to the bucket


_CHECKS = {"database": _check_database, "broker": _check_broker, "storage": _check_storage}


def readyz(request: HttpRequest) -> JsonResponse:
    """200 when the database, the broker and the content store all answer; 503 otherwise.

    For load balancers: a process that cannot reach what requests need takes no traffic.
    """
    checks = {}
    for name, check in _CHECKS.items():
        try:
            check()
            checks[name] = "ok"
        except Exception as exc:
            # Its type and frames only: messages may carry connection strings.
            logger.warning("readyz: %s unavailable: %s", name, exception_trace(exc))
            checks[name] = "unavailable"
    if all(state == "ok" for state in checks.values()):
        return JsonResponse({"status": "ok", "checks": checks})
    down = ", ".join(name for name, state in checks.items() if state != "ok")
    return render_plain(
        ServiceUnavailable(
            f"Not ready: {down} unavailable.",
            code=ErrorCode.NOT_READY,
            headers={"Retry-After": "5"},
            extra={"checks": checks},
        )
    )


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus metrics. With BOARDWALK_METRICS_TOKEN set, that token as a Bearer is needed;
    without it, only loopback clients are served (docs/DEPLOYMENT.md, "Operations")."""
    token = settings.METRICS_TOKEN
    if token:
        scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(sent.strip(), token):
            return render_plain(AuthenticationError("Send the metrics token as a Bearer."))
    elif not _loopback(request.META.get("REMOTE_ADDR", "")):
        return render_plain(
            ScopeError("Metrics are served to loopback only unless BOARDWALK_METRICS_TOKEN is set.")
        )
    return HttpResponse(metrics.render(), content_type="text/plain; version=0.0.4; charset=utf-8")
