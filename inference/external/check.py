"""Is this URL an OpenAI-compatible server that serves this model? (`manage.py model inspect`
and `model add --check` with `--engine-url`.)

`upstream_check(upstream)` asks `GET {url}/models` for the model and its context length where
the server gives one (vLLM's and SGLang's `max_model_len`), then sends a one-token chat
completion. It answers what it found (`UpstreamCheck`) or raises `CheckRefused` with a reason
a person can act on: the server is not reachable, is not OpenAI-compatible (no model list at
`/models`), does not serve the model, refused the API key, or failed the one-token request.
Messages name the URL and the variable, never the key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import httpx2
import orjson

from inference.external.client import Success, classify_response, upstream_message
from inference.external.upstream import Upstream

__all__ = ["CheckRefused", "UpstreamCheck", "upstream_check"]

# Keys a model entry of /v1/models may carry its context length under: vLLM and SGLang
# answer max_model_len; others use one of the rest.
_CONTEXT_KEYS = ("max_model_len", "context_length", "max_context_length", "context_window")
_PROBE = [{"role": "user", "content": "Say hello."}]
_LISTED = 10


class CheckRefused(Exception):
    """The upstream cannot serve the revision; the message says why and what to change."""


@dataclass(frozen=True)
class UpstreamCheck:
    url: str
    model: str
    context_length: int | None  # None: the server does not say
    usage_reported: bool  # the one-token answer carried `usage`
    completion_tokens: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def upstream_check(
    upstream: Upstream, *, key_variable: str = "", timeout: float = 30.0
) -> UpstreamCheck:
    """Check `upstream` as described above. `key_variable` names the key's variable in
    messages (the key itself never appears)."""
    with httpx2.Client(
        headers=upstream.headers(),
        timeout=httpx2.Timeout(timeout, connect=min(timeout, upstream.connect_timeout)),
        follow_redirects=False,
        trust_env=False,
    ) as http:
        entry = _listed_model(http, upstream, key_variable)
        answer = _one_token(http, upstream, key_variable)
    usage = answer.get("usage")
    completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return UpstreamCheck(
        url=upstream.url,
        model=upstream.model,
        context_length=_context_length(entry),
        usage_reported=isinstance(usage, dict),
        completion_tokens=completion if isinstance(completion, int) else None,
    )


def _get(http: httpx2.Client, url: str) -> httpx2.Response:
    try:
        return http.get(url)
    except httpx2.TimeoutException as exc:
        raise CheckRefused(
            f"{url} did not answer in time: is the server up, and is --engine-url right?"
        ) from exc
    except httpx2.RequestError as exc:
        raise CheckRefused(
            f"cannot reach {url} ({type(exc).__name__}): is the server running, and is "
            "--engine-url right?"
        ) from exc


def _auth_refusal(status: int, url: str, key_variable: str) -> CheckRefused:
    if key_variable:
        return CheckRefused(
            f"{url} refused the API key in {key_variable} ({status}): set {key_variable} to a "
            "key the server accepts"
        )
    return CheckRefused(
        f"{url} asks for an API key ({status}): put one in an environment variable and name "
        "it with --engine-api-key-env"
    )


def _listed_model(http: httpx2.Client, upstream: Upstream, key_variable: str) -> dict[str, Any]:
    url = f"{upstream.url}/models"
    response = _get(http, url)
    if response.status_code in (401, 403):
        raise _auth_refusal(response.status_code, url, key_variable)
    hint = "" if upstream.url.endswith("/v1") else " (the URL usually ends in /v1)"
    if response.status_code != 200:
        raise CheckRefused(
            f"not an OpenAI-compatible server: GET {url} answered {response.status_code}{hint}"
        )
    try:
        data = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        data = None
    listed = data.get("data") if isinstance(data, dict) else None
    if not isinstance(listed, list):
        raise CheckRefused(
            f"not an OpenAI-compatible server: GET {url} answered no model list "
            f"(a JSON object with `data`){hint}"
        )
    entries = [e for e in listed if isinstance(e, dict)]
    for entry in entries:
        if entry.get("id") == upstream.model:
            return entry
    served = ", ".join(str(e.get("id")) for e in entries[:_LISTED]) or "nothing"
    more = f" and {len(entries) - _LISTED} more" if len(entries) > _LISTED else ""
    raise CheckRefused(
        f"{upstream.url} does not serve {upstream.model!r}; it serves: {served}{more} "
        "(--engine-model is the id the server lists)"
    )


def _context_length(entry: dict[str, Any]) -> int | None:
    for key in _CONTEXT_KEYS:
        value = entry.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _one_token(http: httpx2.Client, upstream: Upstream, key_variable: str) -> dict[str, Any]:
    url = f"{upstream.url}/chat/completions"
    body = {"model": upstream.model, "messages": _PROBE, "max_tokens": 1, "temperature": 0}
    try:
        response = http.post(url, content=orjson.dumps(body))
    except httpx2.RequestError as exc:
        raise CheckRefused(
            f"the one-token request to {url} got no answer ({type(exc).__name__})"
        ) from exc
    if response.status_code in (401, 403):
        raise _auth_refusal(response.status_code, url, key_variable)
    outcome = classify_response(response.status_code, response.headers, response.content)
    if isinstance(outcome, Success):
        return outcome.body
    if 200 <= response.status_code < 300:
        raise CheckRefused(
            f"the one-token request to {url} answered no chat completion (no `choices`)"
        )
    code, message = upstream_message(response.content)
    said = f": {message[:200]}" if message else ""
    raise CheckRefused(
        f"the one-token request to {url} failed with {response.status_code}"
        f"{f' ({code})' if code else ''}{said}"
    )
