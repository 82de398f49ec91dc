"""Sectioned input through a whole batch (docs/API.md "BatchRouter sectioned input"): merged bodies
run, results keep each request's custom_id in the standard format, and the format and metadata must
agree."""

from __future__ import annotations

import pytest

from batches.models import Batch, BatchItem
from billing.pricing import TokenPrices, token_charge
from inference.rendering import render_prompt
from inference.runtime import tokenizer_for
from tests.batches.conftest import finalize, run_worker
from tests.batches.test_create import create
from tests.conftest import PRICES, Api, content_of, jsonl, parse_jsonl, request_line

pytestmark = pytest.mark.django_db

SECTIONED = {"batchrouter_input_format": "sectioned.v1"}
SYSTEM = "You are a careful support agent. " * 12


def sectioned_file(n: int) -> bytes:
    rows: list[dict] = [
        {"type": "header", "format": "batchrouter.sectioned.v1"},
        {
            "type": "section",
            "section_id": "s1",
            "body": {
                "model": "boardwalk/tiny-chat",
                "max_completion_tokens": 6,
                "temperature": 0,
                "messages": [{"role": "system", "content": SYSTEM}],
            },
        },
    ]
    for i in range(n):
        body: dict = {"messages": [{"role": "user", "content": f"Question {i}"}]}
        if i == 1:
            body["n"] = 2  # a request field overrides the section's
        rows.append({"type": "request", "custom_id": f" id\u00e9-{i} ", "body": body})
    return jsonl(*rows)


def test_sectioned_file_needs_the_format_in_metadata_and_vice_versa(api: Api, catalog_model):
    sectioned = api.upload(sectioned_file(2)).json()["id"]
    response = create(api, sectioned)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "input_format_mismatch"
    assert Batch.objects.count() == 0
    standard = api.upload(jsonl(request_line("a"))).json()["id"]
    response = create(api, standard, key="k2", metadata=SECTIONED)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "input_format_mismatch"
    assert Batch.objects.count() == 0


def test_sectioned_batch_runs_merged_requests_and_bills_cached_prefixes(api: Api, catalog_model):
    file_id = api.upload(sectioned_file(8)).json()["id"]
    response = create(api, file_id, metadata=SECTIONED)
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["metadata"] == SECTIONED
    items = list(BatchItem.objects.filter(batch_id=data["id"]).order_by("index"))
    # The section is stored once, in the file: every item points at the same section line.
    assert len({(i.section_offset, i.section_length) for i in items}) == 1
    tokenizer = tokenizer_for(catalog_model.revision)
    messages = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question {i}"}]
        for i in range(8)
    ]
    assert [i.prompt_tokens for i in items] == [len(render_prompt(tokenizer, m)) for m in messages]
    assert [i.max_tokens for i in items] == [6] * 8 and items[1].n == 2

    run_worker(data["id"])
    batch = finalize(data["id"])
    assert batch is not None and batch.status == "completed"
    payload = api.get(f"/v1/batches/{data['id']}").json()
    output = parse_jsonl(content_of(api.get(f"/v1/files/{payload['output_file_id']}/content")))
    assert [r["custom_id"] for r in output] == [f" id\u00e9-{i} " for i in range(8)]
    bodies = [r["response"]["body"] for r in output]
    assert [len(b["choices"]) for b in bodies] == [1, 2, 1, 1, 1, 1, 1, 1]
    assert all(b["usage"]["completion_tokens"] <= 6 * len(b["choices"]) for b in bodies)
    # Requests that share the section's prefix reuse its computed keys and values (the first
    # computation of the prefix is not cached), and pay the cached rate for those tokens.
    cached = [b["usage"]["prompt_tokens_details"]["cached_tokens"] for b in bodies]
    assert sum(1 for c in cached if c > 0) >= 4
    prices = TokenPrices(*PRICES)
    expected = sum(
        token_charge(
            prices,
            prompt=b["usage"]["prompt_tokens"],
            cached=b["usage"]["prompt_tokens_details"]["cached_tokens"],
            completion=b["usage"]["completion_tokens"],
        )
        for b in bodies
    )
    assert payload["charge_microusd"] == str(expected)


def test_two_hundred_requests_sharing_a_section_prefix_compute_it_once(api: Api, catalog_model):
    tokenizer = tokenizer_for(catalog_model.revision)
    words = ("Answer as the bakery's careful support agent, briefly and politely. " * 80).split()
    system = " ".join(words[:100])
    while len(render_prompt(tokenizer, [{"role": "system", "content": system}])) < 500:
        system += " " + words[len(system.split()) % len(words)]
    rows: list[dict] = [
        {"type": "header", "format": "batchrouter.sectioned.v1"},
        {
            "type": "section",
            "section_id": "prefix",
            "body": {
                "model": "boardwalk/tiny-chat",
                "max_completion_tokens": 2,
                "temperature": 0,
                "messages": [{"role": "system", "content": system}],
            },
        },
    ]
    rows += [
        {
            "type": "request",
            "custom_id": f"q{i}",
            "body": {"messages": [{"role": "user", "content": f"Question {i}?"}]},
        }
        for i in range(200)
    ]
    file_id = api.upload(jsonl(*rows)).json()["id"]
    response = create(api, file_id, metadata=SECTIONED)
    assert response.status_code == 200, response.content

    run_worker(response.json()["id"])
    batch = finalize(response.json()["id"])

    assert batch is not None and batch.status == "completed"
    payload = api.get(f"/v1/batches/{batch.id}").json()
    output = parse_jsonl(content_of(api.get(f"/v1/files/{payload['output_file_id']}/content")))
    assert len(output) == 200
    usage = [r["response"]["body"]["usage"] for r in output]
    prefix = len(render_prompt(tokenizer, [{"role": "system", "content": system}]))
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usage]
    # The prefix is computed once (by whichever row ran first); every other row reads all of
    # its whole blocks from the cache and pays the cached rate for them.
    assert sorted(cached)[0] == 0 and cached.count(0) == 1
    assert all(c >= prefix // 16 * 16 for c in cached if c)
    assert payload["usage"]["input_tokens_details"]["cached_tokens"] == sum(cached)
