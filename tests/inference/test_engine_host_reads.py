"""Steady decoding reads device values into Python once per forward: the sampled tokens.

Every other read (`.tolist()`, `.item()`, `bool(tensor)`, and ops whose output size depends on
the data: `nonzero`, `unique`, `masked_select`, `repeat_interleave` without `output_size`) is a
synchronisation on a GPU that stalls the host until the device catches up. They are counted
here on the CPU, where the same calls are made, through a dispatch mode that sees every aten op
and patched Tensor methods.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from inference.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, load_model
from inference.engine import runner as runner_module
from inference.rendering import render_prompt

pytestmark = pytest.mark.model

ROWS = 64
_DATA_SIZED = {"_local_scalar_dense", "nonzero", "_unique2", "_unique", "unique_dim"}
_DATA_SIZED |= {"unique_consecutive", "masked_select"}


class Reads(TorchDispatchMode):
    """Counts reads of device values, in order with the model's forwards."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        if name in _DATA_SIZED or (
            name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) > 1
        ):
            self.events.append(("read", func.__name__))
        return func(*args, **kwargs)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    counter = Reads()
    for method in ("tolist", "item", "__bool__"):
        original = getattr(torch.Tensor, method)

        def counted(self: torch.Tensor, *a: Any, _original: Any = original, _name: str = method):
            counter.events.append(("read", _name))
            return _original(self, *a)

        monkeypatch.setattr(torch.Tensor, method, counted)
    return counter


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "packed"])
def test_steady_decoding_reads_the_device_once_per_forward(
    tiny_model_dir: Path, reads: Reads, monkeypatch: pytest.MonkeyPatch, padded: bool
) -> None:
    model, tokenizer = load_model(str(tiny_model_dir))
    monkeypatch.setattr(runner_module, "_decode_padded", lambda *args: padded)
    hook = model.register_forward_hook(
        lambda module, args, kwargs, out: reads.events.append(("forward", None)),
        with_kwargs=True,
    )
    params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    requests = [
        GenerationRequest(
            str(i),
            render_prompt(tokenizer, [{"role": "user", "content": f"Question {i} on rye?"}]),
            params,
        )
        for i in range(ROWS)
    ]
    # One step's budget holds every prompt: the first forward prefills, the rest decode.
    engine = Engine(
        model,
        tokenizer,
        EngineConfig(context_length=2048, max_batch_size=ROWS, max_step_tokens=8192),
    )
    try:
        with reads:
            results = list(engine.generate(requests))
    finally:
        hook.remove()

    assert all(r.error is None and r.completion_tokens == 12 for r in results)
    per_forward: list[Counter[str]] = []
    for kind, name in reads.events:
        if kind == "forward":
            per_forward.append(Counter())
        elif per_forward:
            per_forward[-1][name] += 1
    decoding = per_forward[1:-1]  # after the prefill's step; the last forward samples last
    assert len(decoding) >= 10
    # The sampled tokens, read once after each forward, and nothing else.
    assert all(sum(found.values()) <= 1 for found in decoding), decoding
