"""What crosses the broker for an interactive request is ciphertext: the body in the request
message and the completion in every reply are sealed under the request's own key."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.exceptions import InvalidTag

from batches.interactive.messages import Submitted, decode_reply, encode_reply

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
