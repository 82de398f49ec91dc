"""What travels over the channels between the web tier and a worker (boardwalk.channels).

Keys: one request list per engine key (every worker serving the key pops from it, so Redis
hands each request to exactly one), one bell list per revision (rung once per request), one
reply list per request, one abort flag per request, one listener flag per request (its web
process still reads the replies), one "taken" flag per request (a request runs once, however
often its message is pushed), one liveness flag per worker feed, one headroom gauge per key
(free rows, per worker), one of the requests each worker runs, and one gauge of the keys
whose requests wait for a worker.
The request message carries the body and the replies carry the completion (content): both
are sealed (AES-256-GCM) under a data key of the request's own, which travels wrapped by the
master key (files.crypto.Keyring, as a file's does), so the broker holds ciphertext only; the
channel expires, and content is never in a row or a log.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import orjson

from batches.queue import EngineKey
from boardwalk.channels import channels
from files.crypto import Keyring, new_data_key
from files.sealing import seal, unseal

REQUEST_PREFIX = "ia:"  # GenerationRequest ids of interactive requests start with this


def request_channel(key: EngineKey) -> str:
    return f"interactive:requests:{key.revision_id}:{key.deployment_id}"


def requests_waiting(key: EngineKey) -> bool:
    """Whether interactive requests of `key` wait for a worker to take them."""
    return channels().length(request_channel(key)) > 0


def bell_channel(revision_id: str) -> str:
    """Rung with the engine key (`wanted_field`) of each request sent for the revision: a
    worker that holds the revision's engine loaded and serves nothing answers it at once
    (batches.interactive.bells), before the wake-up reaches a worker through the broker."""
    return f"interactive:bell:{revision_id}"


def reply_channel(request_id: str) -> str:
    return f"interactive:reply:{request_id}"


def abort_flag(request_id: str) -> str:
    return f"interactive:abort:{request_id}"


def listener_flag(request_id: str) -> str:
    return f"interactive:listening:{request_id}"


def taken_flag(request_id: str) -> str:
    return f"interactive:taken:{request_id}"


def feed_alive_flag(reporter: str) -> str:
    return f"interactive:feed:{reporter}"


WANTED_GAUGE = "interactive:wanted"  # field: an engine key, value 1 while a request waits


def wanted_field(key: EngineKey) -> str:
    return f"{key.revision_id}:{key.deployment_id}"


def others_waiting(key: EngineKey) -> bool:
    """Whether interactive requests of another engine key wait in their channel (no worker
    serving that key has popped them): a run lingering on `key` should give the worker up."""
    ch = channels()
    for field_ in ch.gauge_values(WANTED_GAUGE):
        revision_id, _, deployment_id = field_.partition(":")
        other = EngineKey(revision_id, deployment_id)
        if other != key and ch.length(request_channel(other)) > 0:
            return True
    return False


def headroom_gauge(key: EngineKey) -> str:
    return f"interactive:headroom:{key.revision_id}:{key.deployment_id}"


def in_flight_gauge(key: EngineKey) -> str:
    return f"interactive:inflight:{key.revision_id}:{key.deployment_id}"


def is_interactive(generation_id: str) -> bool:
    return generation_id.startswith(REQUEST_PREFIX)


@dataclass(frozen=True)
class Submitted:
    """One interactive request as a worker receives it."""

    id: str  # the completion's request id (req_…)
    org_id: str
    deployment_id: str
    body: dict[str, Any]
    stream: bool
    deadline: float  # epoch seconds: a worker that pops it later drops it
    # Fixed at acceptance, as a batch's are: token prices [input, cached_input, output] in
    # µUSD per million (catalog; the flex tier's are the batch prices), or a deployment's
    # GPU-second price.
    prices: list[int] | None = None
    gpu_second_price: int = 0
    service_tier: str = "default"
    # The prompt's token ids, as the web process counted them with the revision's tokenizer:
    # the worker generates from these and does not render or tokenize the messages again
    # (None: a message from before they were sent, tokenized in the worker).
    prompt_ids: list[int] | None = None
    # The request's own key: seals this message and every reply; never sent in the clear.
    data_key: bytes = field(default_factory=new_data_key, repr=False)

    @property
    def generation_id(self) -> str:
        return REQUEST_PREFIX + self.id

    def encode(self) -> bytes:
        fields = {k: v for k, v in self.__dict__.items() if k != "data_key"}
        key_id, wrapped = Keyring.current().wrap(self.data_key)
        sealed = seal(self.data_key, orjson.dumps(fields), _aad(self.id, "request"))
        return orjson.dumps(
            {"id": self.id, "key_id": key_id, "wrapped": _b64(wrapped)} | {"sealed": _b64(sealed)}
        )

    @classmethod
    def decode(cls, raw: bytes) -> Submitted:
        envelope = orjson.loads(raw)
        key = Keyring.current().unwrap(envelope["key_id"], base64.b64decode(envelope["wrapped"]))
        plain = unseal(key, base64.b64decode(envelope["sealed"]), _aad(envelope["id"], "request"))
        return cls(**orjson.loads(plain), data_key=key)


def encode_reply(submitted: Submitted, kind: str, **fields: Any) -> bytes:
    """kind: "taken" (a worker has it), "delta" (index, text), "result" (body: the
    completion), "error" (code), "aborted" (its client went away); sealed under the
    request's key."""
    plain = orjson.dumps({"kind": kind, **fields})
    return seal(submitted.data_key, plain, _aad(submitted.id, "reply"))


def decode_reply(submitted: Submitted, raw: bytes) -> dict[str, Any]:
    return orjson.loads(unseal(submitted.data_key, raw, _aad(submitted.id, "reply")))  # type: ignore[no-any-return]


def _aad(request_id: str, kind: str) -> bytes:
    return f"boardwalk:interactive:{kind}:{request_id}".encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
