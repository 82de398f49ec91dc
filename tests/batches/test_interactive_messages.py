"""What crosses the broker for an interactive request is ciphertext: the body in the request
message and the completion in every reply are sealed under the request's own key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.exceptions import InvalidTag
from openai import OpenAI

from batches.interactive.messages import Submitted, decode_reply, encode_reply
from boardwalk.channels import channels

MARKER = "PLAINTEXT-MARKER-do-not-send"


def _submitted(**overrides: Any) -> Submitted:
    fields: dict[str, Any] = {
        "id": "req_0123",
        "org_id": "org_1",
        "deployment_id": "",
        "body": {"model": "m", "messages": [{"role": "user", "content": MARKER}]},
        "stream": False,
        "deadline": 0.0,
    }
    return Submitted(**(fields | overrides))


def test_the_request_message_is_sealed_and_opens_to_the_same_request():
    submitted = _submitted()
    raw = submitted.encode()
    assert MARKER.encode() not in raw
    opened = Submitted.decode(raw)
    assert opened == submitted and opened.data_key == submitted.data_key


def test_a_reply_is_sealed_to_its_request():
    submitted = _submitted()
    raw = encode_reply(submitted, "delta", index=0, text=MARKER)
    assert MARKER.encode() not in raw
    assert decode_reply(submitted, raw) == {"kind": "delta", "index": 0, "text": MARKER}
    other = _submitted(id="req_other")
    with pytest.raises(InvalidTag):
        decode_reply(other, raw)  # another request's key, another request's id


@pytest.fixture
def sent(monkeypatch) -> Iterator[list[bytes]]:
    store = channels()
    messages: list[bytes] = []
    push = store.push

    def recording(key: str, message: bytes, *, ttl: float) -> None:
        messages.append(message)
        push(key, message, ttl=ttl)

    monkeypatch.setattr(store, "push", recording)
    yield messages


@pytest.mark.django_db(transaction=True)
def test_no_content_crosses_the_channels_in_the_clear(
    live_server, tenant, catalog_model, in_process_worker, sent, settings
):
    settings.INTERACTIVE_LINGER_SECONDS = 0.5
    client = OpenAI(base_url=f"{live_server.url}/v1", api_key=tenant.write_key, max_retries=0)
    completion = client.chat.completions.create(
        model="boardwalk/tiny-chat",
        messages=[{"role": "user", "content": MARKER}],
        max_completion_tokens=8,
        temperature=0,
    )
    client.close()
    text = completion.choices[0].message.content or ""
    assert len(sent) >= 3  # the request, "taken", the result
    for message in sent:
        assert MARKER.encode() not in message
        if len(text) >= 4:
            assert text.encode() not in message
