"""What travels over the channels between the web tier and a worker (boardwalk.channels).

Keys: one request list per engine key (every worker serving the key pops from it, so Redis
hands each request to exactly one), one reply list per request, one abort flag per request,
one headroom gauge per key (free rows, per worker) and one of the requests each worker runs.
The request message carries the body (content): it lives only in the channel, which
expires, never in a row or a log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from batches.queue import EngineKey
from boardwalk.channels import channels

REQUEST_PREFIX = "ia:"  # GenerationRequest ids of interactive requests start with this


def request_channel(key: EngineKey) -> str:
    return f"interactive:requests:{key.revision_id}:{key.deployment_id}"


def requests_waiting(key: EngineKey) -> bool:
    """Whether interactive requests of `key` wait for a worker to take them."""
    return channels().length(request_channel(key)) > 0


def reply_channel(request_id: str) -> str:
    return f"interactive:reply:{request_id}"


def abort_flag(request_id: str) -> str:
    return f"interactive:abort:{request_id}"


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

    @property
    def generation_id(self) -> str:
        return REQUEST_PREFIX + self.id

    def encode(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def decode(cls, raw: bytes) -> Submitted:
        return cls(**orjson.loads(raw))


def encode_reply(kind: str, **fields: Any) -> bytes:
    """kind: "taken" (a worker has it), "delta" (index, text), "result" (body: the
    completion), "error" (code), "aborted" (its client went away)."""
    return orjson.dumps({"kind": kind, **fields})


def decode_reply(raw: bytes) -> dict[str, Any]:
    return orjson.loads(raw)
