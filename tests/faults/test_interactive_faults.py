"""Interactive requests under faults, on the production shape (PostgreSQL, a Redis of the
test's own, `manage.py serve` and `run_worker` processes): a client that closes its stream,
a worker killed mid-stream, Redis killed mid-stream and mid-request, the web process killed
mid-stream, and a Redis blip under continuing traffic.

The money invariants (docs/BILLING.md, "Interactive requests"), checked on the ledger: every
hold is released exactly once; a request answered with an error is never charged; a request
cut short pays exactly its prompt and the tokens generated before it stopped (its usage
events), and never its whole `max_completion_tokens`."""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from billing.models import LedgerEntry, UsageEvent
from billing.pricing import TokenPrices, token_charge
from tests.conftest import INTERACTIVE_PRICES, make_tenant, postgres_only, redis_only
from tests.faults.conftest import Proc, Stack, needs_redis_server, wait_for

pytestmark = [
    postgres_only,
    redis_only,
    needs_redis_server,
    pytest.mark.django_db(transaction=True),
]

LONG = 2000  # tokens asked for: a request that runs long enough to be cut (context 2048)
# Short waits for the processes, so a scenario takes seconds (production: 30 s each).
WEB_SETTINGS = {"BOARDWALK_INTERACTIVE_QUEUE_SECONDS": "20"}


def _eos_bias(model_dir: Path) -> dict[str, int]:
    """A logit_bias that bans the model's end-of-sequence tokens: it generates to the end."""
    config = json.loads((model_dir / "generation_config.json").read_text())
    ids = config["eos_token_id"]
    return {str(i): -100 for i in (ids if isinstance(ids, list) else [ids])}


class Interactive:
    def __init__(self, stack: Stack, port: int, key: str, bias: dict[str, int]) -> None:
        self.stack, self.port, self.key, self.bias = stack, port, key, bias

    def body(self, *, stream: bool, tokens: int = LONG) -> bytes:
        return orjson.dumps(
            {
                "model": "boardwalk/tiny-chat",
                "messages": [{"role": "user", "content": "Tell me a long story."}],
                "max_completion_tokens": tokens,
                "logit_bias": self.bias,
                "stream": stream,
            }
        )

    def open_stream(self) -> tuple[http.client.HTTPConnection, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=self.body(stream=True),
            headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        assert response.status == 200, response.read()[:500]
        return conn, response

    def plain(self, *, tokens: int = LONG, timeout: float = 120) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(
                "POST",
                "/v1/chat/completions",
                body=self.body(stream=False, tokens=tokens),
                headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
            )
            response = conn.getresponse()
            return response.status, orjson.loads(response.read() or b"null")
        finally:
            conn.close()


def _events(response: Any, count: int) -> list[dict[str, Any]]:
    """The next `count` data events of a stream (fewer if it ends)."""
    events: list[dict[str, Any]] = []
    while len(events) < count:
        line = response.readline()
        if not line:
            break
        if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
            events.append(orjson.loads(line[6:]))
    return events


def _rest(response: Any) -> list[dict[str, Any]]:
    try:
        return _events(response, 10**9)
    except (OSError, http.client.HTTPException):
        return []  # the connection was cut


def _request_id(first: dict[str, Any]) -> str:
    return "req_" + first["id"].removeprefix("chatcmpl-")


def _settled(request_id: str) -> bool:
    return LedgerEntry.objects.filter(request_id=request_id, kind="release").exists()


def _check_money(request_id: str, *, charged: bool) -> int:
    """Hold released once; the charge is 0 (`charged` False) or exactly the prompt plus the
    tokens generated before the stop, fewer than asked. Returns the tokens generated."""
    ledger = LedgerEntry.objects.filter(request_id=request_id)
    holds = list(ledger.filter(kind="hold").values_list("amount_microusd", flat=True))
    releases = list(ledger.filter(kind="release").values_list("amount_microusd", flat=True))
    assert len(holds) == 1 and releases == holds, (holds, releases)
    charges = list(ledger.filter(kind="charge").values_list("amount_microusd", flat=True))
    refunds = list(ledger.filter(kind="refund").values_list("amount_microusd", flat=True))
    usage = {e.kind: e.quantity for e in UsageEvent.objects.filter(request_id=request_id)}
    generated = usage.get("output_tokens", 0)
    if not charged:
        assert sum(charges) - sum(refunds) == 0, (charges, refunds)
        return generated
    expected = token_charge(
        TokenPrices(*INTERACTIVE_PRICES),
        prompt=usage["input_tokens"],
        cached=usage.get("cached_tokens", 0),
        completion=generated,
    )
    assert charges == [expected] and not refunds, (charges, expected, refunds)
    assert 0 < generated < LONG
    return generated


@pytest.fixture
def interactive(stack: Stack, catalog_model, tiny_model_dir: Path) -> Interactive:
    tenant = make_tenant("interactive-faults")
    stack.web_with(**WEB_SETTINGS)
    stack.workers({})
    return Interactive(stack, stack.web_port, tenant.write_key, _eos_bias(tiny_model_dir))


def test_a_stream_the_client_closes_is_stopped_and_pays_what_it_generated(
    interactive: Interactive, scenario
):
    conn, response = interactive.open_stream()
    first = _events(response, 6)
    request_id = _request_id(first[0])
    conn.close()  # the client goes away mid-answer
    wait_for(lambda: _settled(request_id), timeout=60, what="the cut request settled")

    generated = _check_money(request_id, charged=True)
    record = scenario("interactive: client closes the stream")
    record.notes.append(f"charged {generated} of {LONG} tokens")


def test_a_worker_killed_mid_stream_ends_the_stream_and_charges_nothing(
    interactive: Interactive, stack: Stack, scenario
):
    (worker,) = stack.workers({})
    conn, response = interactive.open_stream()
    first = _events(response, 6)
    request_id = _request_id(first[0])
    worker.kill9()
    killed = time.monotonic()
    rest = _rest(response)
    ended = time.monotonic() - killed
    conn.close()

    assert rest and rest[-1].get("error", {}).get("code") == "service_unavailable", rest[-1:]
    wait_for(lambda: _settled(request_id), timeout=30, what="the hold released")
    _check_money(request_id, charged=False)
    record = scenario("interactive: worker kill -9 mid-stream")
    record.recovery.append(ended)
    record.notes.append("recovery = kill to the stream's error event")


def test_redis_killed_mid_stream_stops_the_request_which_pays_what_it_generated(
    interactive: Interactive, stack: Stack, scenario
):
    conn, response = interactive.open_stream()
    first = _events(response, 6)
    request_id = _request_id(first[0])
    stack.kill_redis()
    _rest(response)  # an error event, or the connection cut
    conn.close()
    time.sleep(2)  # the outage
    stack.start_redis()
    wait_for(lambda: _settled(request_id), timeout=60, what="the cut request settled")

    generated = _check_money(request_id, charged=True)
    record = scenario("interactive: Redis kill mid-stream")
    record.notes.append(f"charged {generated} of {LONG} tokens")


def test_the_web_process_killed_mid_stream_stops_the_request_which_pays_what_it_generated(
    interactive: Interactive, stack: Stack, scenario
):
    victim: Proc = stack.start_web(name="web-victim", **WEB_SETTINGS)
    other = Interactive(stack, victim.port, interactive.key, interactive.bias)
    conn, response = other.open_stream()
    first = _events(response, 2)
    request_id = _request_id(first[0])
    victim.kill9()
    conn.close()
    wait_for(lambda: _settled(request_id), timeout=60, what="the cut request settled")

    generated = _check_money(request_id, charged=True)
    record = scenario("interactive: web kill -9 mid-stream")
    record.notes.append(f"charged {generated} of {LONG} tokens")


def test_a_plain_request_answered_503_after_a_redis_kill_is_never_charged(
    interactive: Interactive, stack: Stack, scenario
):
    answers: list[tuple[int, Any]] = []
    caller = threading.Thread(target=lambda: answers.append(interactive.plain()))
    caller.start()
    held = LedgerEntry.objects.filter(kind="hold").exclude(request_id="")
    hold = wait_for(lambda: held.order_by("-id").first(), timeout=60, what="the request held")
    time.sleep(1.5)  # taken and running on the worker
    stack.kill_redis()
    caller.join(60)
    time.sleep(1)
    stack.start_redis()
    wait_for(lambda: _settled(hold.request_id), timeout=60, what="the hold released")

    assert answers and answers[0][0] == 503, answers
    _check_money(hold.request_id, charged=False)
    scenario("interactive: Redis kill mid-request (plain)")


def test_serving_resumes_after_a_redis_blip_under_continuing_traffic(
    interactive: Interactive, stack: Stack, scenario
):
    assert interactive.plain(tokens=4)[0] == 200
    outcomes: list[tuple[float, int]] = []
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            try:
                status = interactive.plain(tokens=4, timeout=30)[0]
            except OSError:
                status = 0
            outcomes.append((time.monotonic(), status))
            time.sleep(0.2)

    sender = threading.Thread(target=traffic)
    sender.start()
    try:
        time.sleep(1)
        stack.kill_redis()
        time.sleep(3)  # the blip, with requests still coming
        stack.start_redis()
        back = time.monotonic()
        wait_for(
            lambda: any(at > back and status == 200 for at, status in outcomes),
            timeout=60,
            what="an interactive request served after Redis returned",
        )
    finally:
        stop.set()
        sender.join(60)
    served = min(at for at, status in outcomes if at > back and status == 200)
    assert all(status in (200, 503) for _, status in outcomes), outcomes  # never a 500
    record = scenario("interactive: Redis blip under traffic")
    record.recovery.append(served - back)
    record.notes.append("recovery = Redis back to the first request served (goal 10 s)")
