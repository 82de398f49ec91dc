"""External engines under faults (issue 41, item 5): a revision answered by a real
`transformers serve` (the tiny model the tests build) behind the fault-injecting proxy of
tests/inference/upstreams.py, served by `manage.py run_worker` processes on PostgreSQL with a
private Redis (the fault suite's production shape, tests/faults/conftest.py).

Each scenario breaks the upstream or a worker from outside and then checks what a client
sees and what it paid: every row once across the output and error files, the ledger's one
hold, one release and one charge equal to the published rows' usage (`check_run`), and the
receipts adding up to the same rows and the same charge. The proxy counts what reached the
upstream: delivery there is at least once, recording and charging exactly once.
"""

from __future__ import annotations

import datetime as dt
import inspect
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
import redis
from django.conf import settings as django_settings

from batches.models import Batch, BatchItem
from boardwalk import clock
from boardwalk.codes import ItemCode
from inference.external.engine import ExternalEngine
from tests.conftest import make_tenant, postgres_only, redis_only
from tests.faults.conftest import (
    Http,
    Proc,
    Scenario,
    Stack,
    batch_rows,
    check_run,
    leased_by,
    needs_redis_server,
    submit,
    time_to_reclaim,
    wait_for,
    wait_terminal,
)
from tests.inference import test_external_engine, test_external_model_command
from tests.inference.test_external_model_command import external
from tests.inference.test_model_command import model
from tests.inference.upstreams import FaultProxy, Served, hold, serve, status

pytestmark = [
    postgres_only,
    redis_only,
    needs_redis_server,
    pytest.mark.django_db(transaction=True),
]

# The served tiny model and its directory without weights, as the external-engine tests use.
served = test_external_engine.served
tokenizer_dir = test_external_model_command.tokenizer_dir

ROWS = 24
MAX_IN_FLIGHT = 4
# Sends of one row at most (the first included), as the workers' engines run: their setting
# where it exists (the workers inherit this process's environment), else the engine's default.
ATTEMPTS = getattr(
    django_settings,
    "EXTERNAL_MAX_ATTEMPTS",
    inspect.signature(ExternalEngine).parameters["max_attempts"].default,
)
PRODUCTION_LEASE = {"BOARDWALK_ITEM_LEASE_SECONDS": "60"}


class Gateway(FaultProxy):
    """The fault proxy as the address the revision names (a gateway, a Kubernetes service):
    the server behind it can be replaced (`replace`). Each request notes when it came (`at`),
    when its answer was over (`done`), and what failed it, if anything: `failed` is
    "upstream" when the server behind cut it or was gone (the gateway then cuts the client's
    connection, as one whose backend died mid-request does), "client" when the client had
    gone by the time its answer was written."""

    _local = threading.local()  # the request the handler thread is answering

    def _answer(self, handler: Any, body: bytes, seen: dict[str, Any]) -> None:
        seen["at"] = time.time()
        self._local.seen = seen
        try:
            super()._answer(handler, body, seen)
        except OSError:
            seen["failed"] = "client" if seen.get("replying") else "upstream"
            self._cut(handler)
        finally:
            seen["done"] = True

    def _reply(  # type: ignore[override]
        self, handler: Any, code: int, content: bytes, headers: dict[str, str] | None = None
    ) -> None:
        self._local.seen["replying"] = True
        FaultProxy._reply(handler, code, content, headers)

    def replace(self, served: Served) -> None:
        self.upstream = urlsplit(served.url.removesuffix("/v1"))


@pytest.fixture
def gateway(served: Served) -> Iterator[Gateway]:
    with Gateway(served.url.removesuffix("/v1")) as running:
        yield running


def _on_external(catalog_model: Any, served: Served, tokenizer: Path, gateway: Gateway) -> str:
    """The catalog model moved onto the server behind the gateway; its revision id."""
    args = external(served, tokenizer, "--max-in-flight", str(MAX_IN_FLIGHT), url=gateway.url)
    changed = model("set-revision", catalog_model.name, *args)
    return str(changed["revision"]["id"])


def _client(stack: Stack) -> Http:
    tenant = make_tenant("external-faults")
    stack.web_with()
    return Http(stack.web_port, tenant.write_key)


# -- what the upstream saw, and what the client was given ---------------------------------


def _custom_ids(rows: list[dict[str, Any]]) -> dict[str, str]:
    """A row's prompt (what the upstream sees) -> its custom_id."""
    return {row["body"]["messages"][0]["content"]: row["custom_id"] for row in rows}


def _sent(gateway: Gateway, rows: list[dict[str, Any]], **match: Any) -> Counter[str]:
    """custom_id -> chat requests of the row that reached the gateway (those whose noted
    fields equal `match`: answer="forward", failed="upstream", …)."""
    ids = _custom_ids(rows)
    counted: Counter[str] = Counter()
    for seen in gateway.posts():
        if all(seen.get(key) == value for key, value in match.items()):
            counted[ids[seen["json"]["messages"][0]["content"]]] += 1
    return counted


def _reached_upstream(gateway: Gateway, rows: list[dict[str, Any]]) -> Counter[str]:
    """Requests the gateway forwarded and the server behind it answered (whether or not
    their client was still there to read it)."""
    counted = _sent(gateway, rows, answer="forward")
    counted.subtract(_sent(gateway, rows, answer="forward", failed="upstream"))
    return +counted


def _files(client: Http, batch_id: str) -> tuple[list[dict], list[dict]]:
    payload = wait_terminal(client, batch_id)
    output = [orjson.loads(x) for x in client.content(payload["output_file_id"]).splitlines()]
    errors = []
    if payload.get("error_file_id"):
        errors = [orjson.loads(x) for x in client.content(payload["error_file_id"]).splitlines()]
    return output, errors


def _check_receipts(client: Http, batch_id: str, output: list[dict]) -> None:
    """The receipts are the published rows, each once, with their usage, adding up to the
    batch's charge."""
    status_code, page = client.json("GET", f"/v1/requests?batch_id={batch_id}&limit=100")
    assert status_code == 200 and page["has_more"] is False, page
    receipts = page["data"]
    by_id = {r["custom_id"]: r for r in receipts}
    assert len(by_id) == len(receipts), "a row has two receipts"
    assert set(by_id) == {row["custom_id"] for row in output}
    for row in output:
        usage = row["response"]["body"]["usage"]
        receipt = by_id[row["custom_id"]]
        assert receipt["status_code"] == 200 and receipt["error_code"] is None
        assert receipt["usage"]["prompt_tokens"] == usage["prompt_tokens"]
        assert receipt["usage"]["completion_tokens"] == usage["completion_tokens"]
    charge = Batch.objects.get(id=batch_id).charge_microusd
    assert sum(int(r["charge_microusd"]) for r in receipts) == charge


def _finish(
    record: Scenario,
    client: Http,
    batch_id: str,
    rows: list[dict[str, Any]],
    *,
    outcome: str = "completed",
) -> tuple[list[dict], list[dict]]:
    """The fault suite's invariants, the receipts, and the files for the scenario's own."""
    record.add(check_run(client, batch_id, rows, outcome=outcome))
    record.assert_clean()
    output, errors = _files(client, batch_id)
    _check_receipts(client, batch_id, output)
    return output, errors


def _a_quarter_done(
    stack: Stack, catalog_model: Any, served: Served, tokenizer: Path, gateway: Gateway, tag: str
) -> tuple[Http, list[dict[str, Any]], str]:
    """The catalog model on the server behind the gateway, one worker, and a batch of ROWS
    a quarter of whose rows are answered: (client, rows, batch id)."""
    _on_external(catalog_model, served, tokenizer, gateway)
    client = _client(stack)
    stack.workers({})
    rows = batch_rows(ROWS, tag=tag)
    batch_id = submit(client, rows, key=tag)
    wait_for(lambda: _succeeded(batch_id) >= ROWS // 4, what="a quarter of the rows")
    return client, rows, batch_id


# -- the scenarios ----------------------------------------------------------------------------


def test_upstream_killed_and_replaced_mid_batch(
    stack: Stack, catalog_model, tokenizer_dir, tiny_model_dir, tmp_path, scenario
):
    """The server behind the gateway is killed with kill -9 while rows are at it and being
    sent, and a replacement takes its place (a pod replaced behind its service): the rows it
    cut are sent again within their attempts and answered; nothing is lost, duplicated or
    charged twice."""
    record = scenario("external upstream killed")
    with (
        serve(tiny_model_dir, tmp_path) as doomed,
        serve(tiny_model_dir, tmp_path) as spare,
        Gateway(doomed.url.removesuffix("/v1")) as gateway,
    ):
        client, rows, batch_id = _a_quarter_done(
            stack, catalog_model, doomed, tokenizer_dir, gateway, tag="u-"
        )
        doomed.process.send_signal(signal.SIGKILL)
        doomed.process.wait()
        since = time.monotonic()
        # Rows go on arriving at the dead server, and are cut, until the replacement is
        # in place.
        wait_for(lambda: _sent(gateway, rows, failed="upstream"), what="a request cut")
        gateway.replace(spare)
        output, errors = _finish(record, client, batch_id, rows)
        record.recovery.append(time.monotonic() - since)
        cut = _sent(gateway, rows, failed="upstream")
        answered = _reached_upstream(gateway, rows)
    # Every row cut fewer times than its attempts was sent again and answered.
    assert errors == [], [e["error"] for e in errors]
    assert {row["custom_id"] for row in output} == {row["custom_id"] for row in rows}
    assert all(count < ATTEMPTS for count in cut.values()), cut
    assert all(answered[custom_id] >= 1 for custom_id in cut), (cut, answered)
    record.notes.append(
        f"{sum(cut.values())} requests of {len(cut)} rows cut; recovery = kill to batch done"
    )


def test_a_429_and_503_storm_backs_off_and_the_batch_finishes(
    stack: Stack, catalog_model, served, tokenizer_dir, gateway, scenario
):
    """The upstream answers a storm of 429s and 503s with Retry-After: the revision's
    in-flight limit (held in Redis across workers) halves, the rows wait and are sent again,
    and when the storm ends the batch finishes. A 429 or 503 says the server took nothing of
    the row, so its retries are not the row's attempts: the storm is longer than a row's
    attempts, and every row is answered, once."""
    record = scenario("external 429/503 storm")
    storm = [status(429 if i % 2 else 503, retry_after="1") for i in range(5 * MAX_IN_FLIGHT)]
    revision_id = _on_external(catalog_model, served, tokenizer_dir, gateway)
    client = _client(stack)
    stack.workers({}, {})
    gateway.plan(*storm)
    rows = batch_rows(ROWS, tag="s-")
    batch_id = submit(client, rows, key="storm")
    limits = redis.Redis(host="127.0.0.1", port=stack.redis_port)
    try:
        # In-flight requests back off: the shared limit drops below the revision's cap.
        halved = wait_for(
            lambda: _limit(limits, revision_id) < MAX_IN_FLIGHT and _limit(limits, revision_id),
            what="the in-flight limit to halve",
        )
        output, errors = _finish(record, client, batch_id, rows)
        grown = _limit(limits, revision_id)
    finally:
        limits.close()
    stormed = _sent(gateway, rows, answer="status")
    assert sum(stormed.values()) == len(storm)  # the whole storm was answered
    assert gateway.max_in_flight <= MAX_IN_FLIGHT
    assert errors == []
    # Every row was answered, and reached the server once.
    answered = _reached_upstream(gateway, rows)
    assert {row["custom_id"] for row in output} == {r["custom_id"] for r in rows}
    assert all(answered[row["custom_id"]] == 1 for row in output), answered
    most = max(stormed.values(), default=0)
    record.notes.append(
        f"storm of {len(storm)} answers; limit {MAX_IN_FLIGHT} -> {halved} -> {grown}; "
        f"a row met it up to {most} times ({ATTEMPTS} attempts a row), every row answered"
    )


def test_upstream_down_past_the_deadline_expires_with_partial_results(
    stack: Stack, catalog_model, served, tokenizer_dir, gateway, scenario
):
    """The upstream stops answering mid-batch (it takes requests and never replies, as a
    wedged server or a gateway with no backend left) and stays so past the batch's expiry:
    the batch ends `expired` with the rows answered before, the rest `batch_expired`, the
    requests held at the upstream closed by the worker, and nothing sent after the expiry."""
    record = scenario("external upstream down")
    client, rows, batch_id = _a_quarter_done(
        stack, catalog_model, served, tokenizer_dir, gateway, tag="d-"
    )
    gateway.plan(*[hold() for _ in range(10 * ROWS)])  # down: nothing answers from now on
    wait_for(lambda: _sent(gateway, rows, answer="hold"), what="a request held upstream")
    # A short completion window, as the other expiry tests give one: the batch's expiry
    # (and its items' deadline) a moment from now.
    expires = clock.now() + dt.timedelta(seconds=2)
    Batch.objects.filter(id=batch_id).update(expires_at=expires)
    BatchItem.objects.filter(batch_id=batch_id).update(deadline=expires)
    since = time.monotonic()
    output, errors = _finish(record, client, batch_id, rows, outcome="expired")
    record.recovery.append(time.monotonic() - since)
    assert output, "the rows answered before the upstream went down are published"
    assert errors and {e["error"]["code"] for e in errors} == {ItemCode.BATCH_EXPIRED}
    held = _sent(gateway, rows, answer="hold")
    assert not held.keys() & {row["custom_id"] for row in output}
    # The worker closed what it had at the upstream (vLLM and SGLang abort a request whose
    # client went away), and sent nothing once the batch had expired.
    wait_for(lambda: len(gateway.closed_by_client) == sum(held.values()), what="held closed")
    assert max(seen["at"] for seen in gateway.posts()) < expires.timestamp()
    record.notes.append(
        f"{len(output)} rows published, {len(errors)} expired, {sum(held.values())} requests "
        "held upstream closed; recovery = expiry set to batch ended"
    )


def test_a_worker_killed_with_rows_in_flight_upstream(
    stack: Stack, catalog_model, served, tokenizer_dir, gateway, scenario
):
    """A worker is killed with kill -9 while its rows are at the upstream (each request held
    a second at the gateway first, so they are caught there). The other worker recovers its
    leases and sends those rows again: the upstream sees them twice (the victim's requests
    still reach it after it died), yet each row is recorded, published and charged once."""
    record = scenario("external worker kill -9")
    gateway.delay = 1.0
    _on_external(catalog_model, served, tokenizer_dir, gateway)
    client = _client(stack)
    workers = stack.workers(PRODUCTION_LEASE, PRODUCTION_LEASE)
    rows = batch_rows(ROWS, tag="k-")
    batch_id = submit(client, rows, key="worker-killed")
    ids = _custom_ids(rows)

    def caught() -> tuple[Proc, dict[int, int]] | None:
        """A worker with a row of the batch at the gateway right now, and its leases."""
        waiting = {ids[s["json"]["messages"][0]["content"]] for s in _unanswered(gateway)}
        for worker in workers:
            held = leased_by(worker, batch_id)
            mine = BatchItem.objects.filter(id__in=list(held), custom_id__in=waiting)
            if mine.exists():
                return worker, held
        return None

    victim, held = wait_for(caught, what="a worker with a row at the upstream")
    in_flight = set(
        BatchItem.objects.filter(id__in=list(held)).values_list("custom_id", flat=True)
    ) & {ids[s["json"]["messages"][0]["content"]] for s in _unanswered(gateway)}
    since = time.monotonic()
    victim.kill9()
    recovery = time_to_reclaim(held, victim, since)
    if recovery is not None:
        record.recovery.append(recovery)
    output, errors = _finish(record, client, batch_id, rows)
    assert errors == [], [e["error"] for e in errors]
    reached = _reached_upstream(gateway, rows)
    # The victim's requests reached the upstream after it died, and its rows were sent
    # again by the survivor: at least once upstream, once in the output, charged once.
    twice = {custom_id for custom_id, count in reached.items() if count >= 2}
    # (A row whose answer the victim recorded in the instant before it died kept its token.)
    resent = {
        custom_id
        for item_id, custom_id, token in BatchItem.objects.filter(id__in=list(held)).values_list(
            "id", "custom_id", "lease_token"
        )
        if custom_id in in_flight and token != held[item_id]
    }
    assert resent and resent <= twice, (in_flight, resent, reached)
    assert Counter(row["custom_id"] for row in output) == Counter(r["custom_id"] for r in rows)
    record.notes.append(
        f"{len(twice)} rows reached the upstream twice, each recorded and charged once; "
        "production lease 60 s; recovery = kill to first re-claim"
    )


# -- small reads ------------------------------------------------------------------------------


def _succeeded(batch_id: str) -> int:
    return BatchItem.objects.filter(batch_id=batch_id, state=BatchItem.State.SUCCEEDED).count()


def _limit(client: redis.Redis, revision_id: str) -> int:
    """The revision's shared in-flight limit now (0 before the first request)."""
    value = client.hget(f"boardwalk:external:{revision_id}:state", "limit")
    return int(value) if value is not None else 0


def _unanswered(gateway: Gateway) -> list[dict[str, Any]]:
    """Chat requests at the gateway not answered yet (held by its delay)."""
    return [s for s in gateway.posts() if "done" not in s]
