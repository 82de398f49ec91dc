"""The interactive tier's settings: from the environment, overridable in Django settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from boardwalk.env import env_float, env_int

_DEFAULTS: dict[str, Any] = {
    # Requests of one organization in flight at once (its answer's x-ratelimit-*-requests).
    "INTERACTIVE_MAX_CONCURRENT": env_int("BOARDWALK_INTERACTIVE_MAX_CONCURRENT", 16),
    # Prompt + max output tokens one organization may start per minute.
    "INTERACTIVE_TOKENS_PER_MINUTE": env_int("BOARDWALK_INTERACTIVE_TOKENS_PER_MINUTE", 200_000),
    # How long a request waits for a worker to take it before it answers 503.
    "INTERACTIVE_QUEUE_SECONDS": env_float("BOARDWALK_INTERACTIVE_QUEUE_SECONDS", 30.0),
    # The longest a request runs once taken (then it is aborted and answers 503).
    "INTERACTIVE_TIMEOUT_SECONDS": env_float("BOARDWALK_INTERACTIVE_TIMEOUT_SECONDS", 600.0),
    # A worker that served an interactive request keeps its engine this long for the next.
    "INTERACTIVE_LINGER_SECONDS": env_float("BOARDWALK_INTERACTIVE_LINGER_SECONDS", 30.0),
    # Seconds a flex request without headroom is told to wait (Retry-After).
    "INTERACTIVE_FLEX_RETRY_AFTER": env_int("BOARDWALK_INTERACTIVE_FLEX_RETRY_AFTER", 2),
}


def setting(name: str) -> Any:
    return getattr(settings, name, _DEFAULTS[name])
