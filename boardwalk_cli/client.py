"""The HTTP client of the API: one session, short retries the server asks for, and the API's
refusals as errors that keep its error object."""

from __future__ import annotations

import time
from typing import Any

import requests
import urllib3

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
CHUNK = 1024 * 1024

# What a connection that fails, stalls or is cut raises: requests' own exceptions, and
# urllib3's from reading a streamed body.
NETWORK_ERRORS = (requests.RequestException, urllib3.exceptions.HTTPError)


class CliError(Exception):
    def __init__(
        self, message: str, *, exit_code: int = 1, error: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.error = error  # the API's error object, when the API refused

    @property
    def code(self) -> str | None:
        return str(self.error.get("code")) if self.error else None


class Client:
    def __init__(self, base_url: str, api_key: str, *, timeout: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.session.headers["User-Agent"] = "boardwalk-cli/1"
        self.timeout = timeout

    def call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        url = f"{self.base_url}{path}"
        for attempt in range(4):
            try:
                response = self.session.request(method, url, timeout=self.timeout, **kwargs)
            except requests.RequestException as exc:
                raise CliError(f"cannot reach {url}: {exc}", exit_code=3) from exc
            retry_after = response.headers.get("retry-after")
            should = response.headers.get("x-should-retry")
            if should == "true" and retry_after and attempt < 3 and int(retry_after) <= 5:
                response.close()
                time.sleep(int(retry_after))  # short waits only; longer ones are reported
                continue
            break
        if response.status_code >= 400 and not kwargs.get("stream"):
            raise refusal(response)
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.call(method, path, **kwargs).json()


def refusal(response: requests.Response) -> CliError:
    """The API's refusal as an error that keeps the API's error object."""
    try:
        error = response.json()["error"]
        text = f"{response.status_code} {error.get('code')}: {error.get('message')}"
    except (ValueError, KeyError, TypeError):
        error = None
        text = f"{response.status_code} {response.reason}"
    except NETWORK_ERRORS as exc:  # the error body itself was cut
        raise CliError(f"cannot read the answer of {response.url}: {exc}", exit_code=3) from exc
    if response.headers.get("retry-after"):
        text += f" (retry after {response.headers['retry-after']} s)"
    request_id = response.headers.get("x-request-id")
    text = f"{text} [request {request_id}]" if request_id else text
    return CliError(text, error=error if isinstance(error, dict) else None)
