"""The outbound client's address rules against SSRF probes and DNS rebinding
(docs/API.md "Limits, retention and privacy").

The resolver is the system's `socket.getaddrinfo`, which the test controls: a name that answers
loopback, and one that answers a public address first and loopback afterwards (rebinding)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from boardwalk import outbound
from tests.media_helpers import https_server

PROBES = [
    "https://2130706433/",
    "https://0177.0.0.1/",
    "https://0x7f.0.0.1/",
    "https://[::1]/",
    "https://0.0.0.0/",
    "https://[::ffff:127.0.0.1]/",
    "https://[::ffff:7f00:1]/",
    "https://169.254.169.254/latest/meta-data/",
    "https://192.168.1.1/",
    "https://loopback.test/",
]


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Names → the answers they give, one per lookup (the last one repeats)."""
    answers: dict[str, list[str]] = {"loopback.test": ["127.0.0.1"]}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in answers:
            queue = answers[host]
            host = queue.pop(0) if len(queue) > 1 else queue[0]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


@pytest.mark.parametrize("url", PROBES)
def test_non_public_targets_are_refused_before_anything_is_sent(url: str, resolver: Any):
    with pytest.raises(outbound.OutboundRefused) as refused:
        outbound.request("GET", url, timeout=3)
    assert refused.value.reason == "not_public"


def test_a_rebinding_name_is_connected_to_at_the_address_that_was_checked(
    resolver: dict[str, list[str]],
):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        port = listener.getsockname()[1]
        # Public when checked, loopback (where the listener waits) on any later lookup.
        resolver["rebind.test"] = ["192.0.43.10", "127.0.0.1"]
        with pytest.raises(outbound.OutboundError) as failed:
            outbound.request("GET", f"https://rebind.test:{port}/", timeout=2)
        assert failed.value.reason in ("connect", "timeout")
        with pytest.raises(BlockingIOError):  # no connection ever reached loopback
            listener.accept()


def test_an_allowed_local_https_target_is_trusted_through_configuration(
    settings: Any, tmp_path: Path
):
    with https_server(tmp_path, {"/": lambda: (200, {}, b"hello")}) as server:
        url = server.url("/")
        with pytest.raises(outbound.OutboundRefused):  # not named: the address rules apply
            outbound.request("GET", url, timeout=3)
        settings.OUTBOUND_ALLOW = [f"localhost:{server.port}"]
        with pytest.raises(outbound.OutboundError, match="connection failed"):
            outbound.request("GET", url, timeout=3)  # self-signed, not trusted yet
        settings.OUTBOUND_CA_BUNDLE = str(server.ca_file)
        assert outbound.request("GET", url, timeout=3).body == b"hello"


@pytest.mark.parametrize(
    "url",
    [
        "https://exa mple.com/",
        "https://exa\tmple.com/",
        "https://exa\nmple.com/",
        "https://exa\x00mple.com/",
        "https://exa%00mple.com/",
        "https://example.com/a b",
        "https://user:pw@example.com/",
        "ftp://example.com/",
    ],
)
def test_a_url_that_is_not_one_plain_host_is_refused_before_any_lookup(
    url: str, monkeypatch: pytest.MonkeyPatch
):
    looked_up: list[Any] = []
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: looked_up.append(a) or real(*a, **k))
    with pytest.raises(outbound.OutboundRefused) as refused:
        outbound.request("GET", url, timeout=3)
    assert refused.value.reason == "bad_url"
    assert looked_up == []  # nothing was looked up, let alone sent
