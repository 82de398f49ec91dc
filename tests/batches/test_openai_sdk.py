"""The official OpenAI SDK drives the whole flow against a live server (docs/API.md "Errors")."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx2
import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletion

from tests.conftest import Tenant, jsonl, request_line

pytestmark = pytest.mark.django_db(transaction=True)


class CountingTransport(httpx2.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.requests = 0

    def handle_request(self, request):
        self.requests += 1
        return super().handle_request(request)


@pytest.fixture
def sdk(live_server, tenant: Tenant) -> Iterator[tuple[OpenAI, CountingTransport]]:
    transport = CountingTransport()
    client = OpenAI(
        base_url=f"{live_server.url}/v1",
        api_key=tenant.write_key,
        _strict_response_validation=True,
        http_client=httpx2.Client(transport=transport),
    )
    yield client, transport
    client.close()


def test_sdk_drives_upload_batch_poll_download_list_cancel_delete(
    sdk, catalog_model, in_process_worker
):
    client, _ = sdk
    body = jsonl(request_line("task-1"), request_line("task-2", content="Another"))
    file = client.files.create(file=("requests.jsonl", body), purpose="batch")
    assert file.status == "processed" and file.bytes == len(body)
    assert client.files.retrieve(file.id).id == file.id
    assert client.files.content(file.id).content == body
    batch = client.batches.create(
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_headers={"Idempotency-Key": "sdk-run-1"},
    )
    assert batch.status == "in_progress"
    deadline = time.monotonic() + 120
    while (
        batch.status not in ("completed", "failed", "cancelled", "expired")
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed"
    assert batch.request_counts.completed == 2
    output = client.files.content(batch.output_file_id).text
    assert output.count("\n") == 2
    assert [b.id for b in client.batches.list(limit=10).data] == [batch.id]

    second_file = client.files.create(
        file=("r.jsonl", jsonl(request_line("x", max_tokens=200))), purpose="batch"
    )
    second = client.batches.create(
        input_file_id=second_file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_headers={"Idempotency-Key": "sdk-run-2"},
    )
    cancelled = client.batches.cancel(second.id)
    assert cancelled.status in ("cancelling", "cancelled", "completed", "finalizing")
    deleted = client.files.delete(batch.output_file_id)
    assert deleted.deleted is True


def test_sdk_errors_are_typed_and_not_retried(sdk, catalog_model):
    client, transport = sdk
    file = client.files.create(file=("r.jsonl", jsonl(request_line())), purpose="batch")
    with pytest.raises(openai.BadRequestError) as missing:
        client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert missing.value.code == "missing_idempotency_key"
    assert "Idempotency-Key" in missing.value.message
    client.batches.create(
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_headers={"Idempotency-Key": "k"},
    )
    other = client.files.create(file=("r.jsonl", jsonl(request_line())), purpose="batch")
    before = transport.requests
    with pytest.raises(openai.ConflictError) as conflict:
        client.batches.create(
            input_file_id=other.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_headers={"Idempotency-Key": "k"},
        )
    assert conflict.value.code == "idempotency_key_reused"
    assert transport.requests == before + 1  # x-should-retry: false stopped the SDK's retries
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-missing")
    with pytest.raises(openai.BadRequestError) as extra:
        client.files.create(
            file=("r.jsonl", jsonl(request_line())),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 3600},
        )
    assert "expires_after" in extra.value.message
    with (
        OpenAI(base_url=str(client.base_url), api_key="bw_wrong_key", max_retries=0) as stranger,
        pytest.raises(openai.AuthenticationError),
    ):
        stranger.files.retrieve(file.id)


LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}},
        },
        "strict": True,
    },
}
ANSWER_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "strict": True,
        "schema": {"type": "object", "properties": {"label": {"enum": ["yes", "no"]}}},
    },
}


def test_sdk_parses_structured_tool_call_and_logprob_rows(sdk, catalog_model, in_process_worker):
    client, _ = sdk
    rows = [
        request_line("schema", max_tokens=40, response_format=ANSWER_FORMAT, seed=1),
        request_line("object", max_tokens=40, response_format={"type": "json_object"}, seed=2),
        request_line("tool", max_tokens=60, tools=[LOOKUP_TOOL], tool_choice="required", seed=3),
        request_line("none", max_tokens=8, tools=[LOOKUP_TOOL], tool_choice="none", seed=4),
        request_line("logprobs", max_tokens=8, logprobs=True, top_logprobs=3, seed=5),
        request_line("plain", max_tokens=8, seed=6),
    ]
    file = client.files.create(file=("requests.jsonl", jsonl(*rows)), purpose="batch")
    batch = client.batches.create(
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_headers={"Idempotency-Key": "sdk-structured"},
    )
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == len(rows)

    output = client.files.content(batch.output_file_id).text
    completions = {}
    for line in output.splitlines():
        row = json.loads(line)
        completions[row["custom_id"]] = ChatCompletion.model_validate(row["response"]["body"])
    schema_choice = completions["schema"].choices[0]
    assert json.loads(schema_choice.message.content or "") in ({"label": "yes"}, {"label": "no"})
    tool_choice = completions["tool"].choices[0]
    assert tool_choice.finish_reason == "tool_calls"
    (call,) = tool_choice.message.tool_calls or []
    assert call.function.name == "lookup" and set(json.loads(call.function.arguments)) == {"id"}
    assert completions["none"].choices[0].message.tool_calls is None
    logprobs = completions["logprobs"].choices[0].logprobs
    assert logprobs is not None and logprobs.content
    assert all(len(t.top_logprobs) == 3 and t.bytes for t in logprobs.content)
    assert completions["plain"].choices[0].logprobs is None
