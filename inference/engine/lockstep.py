"""One engine across N tensor-parallel ranks: every rank runs the same `Engine`, in lockstep.

transformers shards the weights (`DistributedConfig(tp_size=N)`, the family's own plan); each
forward's collectives then need every rank to run the same forward at the same time. Rather
than reach into the engine's steps, every rank runs the whole engine core on the same verbs:
rank 0 (the leader, the only one the worker talks to) broadcasts each verb it applies, in
order, and the followers apply the same:

- each `add` (with the seed the leader chose when the request had none, since an unseeded
  row draws its own random seed), each `abort`, and each `step`;
- each poll of the aborted set by a request's run alone after a step raised (containment.py);
- each reading of what wall-clock time decides (`agreement`): a step's time (the pacer learns
  its caps from it, and `generate` polls aborts by it), the pacer's clock (it lingers a second
  after the last interactive row) and, at each step of a decoding run, whether the run stops
  (something new came for the leader, or its time is up). The leader reads and broadcasts,
  the followers take its reading instead of their own. So batch is paced beside interactive
  requests and steady decoding takes runs on every rank as on one: the plans cannot part.
  Each costs one small broadcast on the gloo group: a step's time once a step, the run's
  answer once a run step (in place of the "step" a single step would have broadcast), the
  clock once a step only while the engine paces;
- each forward that raised ("forward failed", `ranks_check`): a rank that died makes the
  others' collectives raise, which is no request's fault; the broadcast cannot reach it, so
  the engine is broken and its requests go back to the worker instead of failing.

Everything else the engine decides (admission, chunking, preemption, the prefix cache, which
layout a step runs) is a function of those verbs and of the pool's size, which the ranks
agree on at start (`agree_on_pool`: each GPU's free memory differs). The logits after the
plan's gathers are the same tensor on every rank, so seeded sampling draws the same tokens;
followers discard their results. Each broadcast names its verb, so a follower whose engine
asked something else stops (`LockstepBroken`) instead of running collectives that do not
match; the engine process then counts as broken. An out-of-memory step on one rank alone
would part them too: the ranks' pools are the same size and their steps' activations the same
shape, so a step that does not fit fails on every rank alike.

The commands ("clear_prefix_cache", "close") go the same way. The broadcasts
run on a gloo group of their own, so they work on the CPU whichever backend the forward uses
(NCCL on GPUs), and they may wait as long as a worker idles between runs.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .config import EngineConfig
from .types import GenerationRequest, GenerationResult

# The model's collectives: loading a large checkpoint over N ranks can take long.
_MODEL_TIMEOUT = timedelta(hours=2)
# The leader's broadcasts: a follower waits in one for as long as the worker sends nothing.
_IDLE_TIMEOUT = timedelta(days=365)


class LockstepBroken(BaseException):
    """The ranks are no longer in step: a follower's engine asked something other than what
    the leader answered, or a rank is gone. A BaseException so that it passes `Contained`
    (which isolates the requests an `Exception` came from): no request is to blame, and the
    rank must stop, which makes its engine process broken."""


@dataclass(frozen=True)
class RankSetup:
    rank: int
    size: int
    store: str  # a file the ranks meet at (torch.distributed's file:// rendezvous)
    device: str | None  # the worker's device: "cpu", or "cuda[:K]": rank r runs on GPU K + r


def rank_environment(setup: RankSetup) -> None:
    """Set this rank's environment; call before torch touches a GPU (a spawned child)."""
    os.environ.update(RANK=str(setup.rank), LOCAL_RANK=str(setup.rank), WORLD_SIZE=str(setup.size))
    if setup.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        return
    first = int((setup.device or "cuda").partition(":")[2] or 0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(first + setup.size)]
    # Each rank sees the group's GPUs as cuda:0..N-1 and binds cuda:<rank> (transformers
    # binds LOCAL_RANK), so a worker on cuda:4 with N=4 runs on GPUs 4-7.
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids[first : first + setup.size])


class Channel:
    """The leader's broadcasts to the followers (a gloo group of its own)."""

    def __init__(self, group: Any, rank: int) -> None:
        self._group = group
        self.leader = rank == 0

    def share(self, message: Any = None) -> Any:
        """The leader's `message`, on every rank (the leader passes it, followers get it)."""
        import torch.distributed as dist

        box = [message if self.leader else None]
        try:
            dist.broadcast_object_list(box, src=0, group=self._group)
        except Exception as exc:  # a peer's connection closed: it died
            raise LockstepBroken(f"a rank is gone ({type(exc).__name__}: {exc})") from exc
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order, on every rank."""
        import torch.distributed as dist

        values: list[Any] = [None] * dist.get_world_size(self._group)
        dist.all_gather_object(values, value, group=self._group)
        return values


def init_ranks(setup: RankSetup) -> tuple[Channel, str]:
    """Join the process group; returns the channel and the device type the ranks run on."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if setup.device and setup.device.startswith("cuda"):
        visible = torch.cuda.device_count() if cuda else 0
        if visible < setup.size:
            raise RuntimeError(
                f"tensor_parallel_size {setup.size} needs {setup.size} GPUs from "
                f"{setup.device} on; {visible} of them are visible"
            )
    device_id = None
    if cuda:
        torch.cuda.set_device(setup.rank)
        device_id = torch.device("cuda", setup.rank)
    else:
        # N ranks share the cores: each takes its part, or they all contend for every one.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // setup.size))
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"file://{setup.store}",
        rank=setup.rank,
        world_size=setup.size,
        timeout=_MODEL_TIMEOUT,
        device_id=device_id,
    )
    group = dist.new_group(backend="gloo", timeout=_IDLE_TIMEOUT)
    return Channel(group, setup.rank), "cuda" if cuda else "cpu"


def agreement(channel: Channel) -> Callable[[str, Callable[[], Any]], Any]:
    """The engine's `agree` (engine.py) on this rank: the leader reads and broadcasts its
    reading, named by `kind`; a follower takes the leader's (and stops, LockstepBroken, where
    the leader broadcast something else: the ranks have parted)."""
    if channel.leader:

        def lead(kind: str, read: Callable[[], Any]) -> Any:
            value = read()
            channel.share((kind, value))
            return value

        return lead

    def follow_reading(kind: str, read: Callable[[], Any]) -> Any:
        return _expect(channel.share(), kind)[1]

    return follow_reading


def ranks_check(channel: Channel) -> Callable[[], None]:
    """What each rank's model runner asks after a forward raised, before it blames a request:
    are all ranks still there, and did they all fail alike? A rank that died makes the
    forward's collective raise on the others; this broadcast then cannot reach it and raises
    LockstepBroken, so the engine is broken and its requests go back to the worker, never
    failed. Where every rank raised alike (a request's own failure), they go on in lockstep
    to find the request."""

    def check() -> None:
        if channel.leader:
            channel.share(("forward failed",))
        else:
            _expect(channel.share(), "forward failed")

    return check


def agree_on_pool(
    build: Callable[[EngineConfig], Any], config: EngineConfig, channel: Channel
) -> Any:
    """An engine built on every rank with the same K/V pool (the smallest any rank sized)."""
    engine = build(config)
    sizes = channel.gather(engine.kv_cache_bytes)
    if len(set(sizes)) == 1:
        return engine
    del engine  # every rank rebuilds: building runs a forward, whose collectives all must join
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return build(dataclasses.replace(config, kv_cache_bytes=min(sizes)))


# -- the leader's side ------------------------------------------------------------------------


class Leader:
    """Broadcasts each verb the leader applies, and each answer of its aborted poll, to the
    followers; restores the params of the requests it seeded on their results."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._unseeded: dict[str, Any] = {}

    def command(self, message: tuple[Any, ...]) -> tuple[Any, ...]:
        """Broadcast a verb or command ("add" with its request seeded); returns it as the
        followers got it, for the leader to apply."""
        if message[0] == "add":
            message = ("add", self._seeded(message[1]))
        self._channel.share(message)
        return message

    def aborted(self, poll: Callable[[], Collection[str]]) -> Callable[[], Collection[str]]:
        def shared() -> Collection[str]:
            ids = sorted(poll())
            self._channel.share(("aborted", ids))
            return frozenset(ids)

        return shared

    def result(self, result: GenerationResult) -> GenerationResult:
        params = self._unseeded.pop(result.id, None)
        return dataclasses.replace(result, params=params) if params is not None else result

    def _seeded(self, request: GenerationRequest) -> GenerationRequest:
        params = request.params
        if params.temperature <= 0 or params.seed is not None:
            return request
        self._unseeded[request.id] = params
        seeded = dataclasses.replace(params, seed=secrets.randbits(63))
        return dataclasses.replace(request, params=seeded)


# -- a follower's side ------------------------------------------------------------------------


def _expect(message: Any, kind: str) -> Any:
    if not isinstance(message, tuple) or not message or message[0] != kind:
        got = message[0] if isinstance(message, tuple) and message else message
        raise LockstepBroken(f"the engine asked for {kind!r} where the leader answered {got!r}")
    return message


def followed_aborted(channel: Channel) -> Callable[[], Collection[str]]:
    def poll() -> Collection[str]:
        return frozenset(_expect(channel.share(), "aborted")[1])

    return poll


def _not_asked() -> bool:
    return False


def follow(engine: Any, channel: Channel) -> None:
    """A follower's life: apply the verbs the leader applies until it says "close"."""
    from .containment import Contained

    # Contained as on the leader: a request that makes the engine raise does so on every
    # rank, and every rank isolates it the same way (its runs alone poll the leader's aborts).
    core = Contained(engine, alone_aborted=followed_aborted(channel))
    while True:
        message = channel.share()
        kind = message[0] if isinstance(message, tuple) and message else message
        if kind == "add":
            core.add(message[1])
        elif kind == "abort":
            core.abort(message[1])
        elif kind == "step":
            # The leader steps with its `interrupt`, so a follower steps with one too (a
            # decoding run is planned alike); whether the run stops is the leader's answer.
            core.step(interrupt=_not_asked)
        elif kind == "clear_prefix_cache":
            engine.clear_prefix_cache()
        elif kind == "close":
            return
        else:
            raise LockstepBroken(f"the leader sent {kind!r}, which no follower applies")
