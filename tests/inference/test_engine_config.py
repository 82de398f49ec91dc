"""The engine's config (inference/engine/config.py): plain values, checked when built, the
same after crossing to the engine's child process, and as the ranks of a tensor-parallel
engine derive theirs."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from inference.engine import EngineConfig


def test_a_config_pickles_to_an_equal_one() -> None:
    config = EngineConfig(
        context_length=2048,
        max_batch_size=8,
        eos_token_ids=[2, 7],
        markup_tokens=["<think>", "</think>"],
        turn_end_tokens=("<|im_end|>",),
        kv_cache_bytes=1 << 20,
    )
    assert pickle.loads(pickle.dumps(config)) == config  # noqa: S301 (our own bytes)


def test_collections_are_kept_as_values_not_as_the_callers_objects() -> None:
    eos = {2}
    markup = ["<think>"]
    config = EngineConfig(context_length=64, eos_token_ids=eos, markup_tokens=markup)
    eos.add(3)
    markup.append("</think>")
    assert config.eos_token_ids == frozenset({2})
    assert config.markup_tokens == ("<think>",)
    assert hash(config) == hash(
        EngineConfig(context_length=64, eos_token_ids=[2], markup_tokens=("<think>",))
    )


def test_a_config_is_frozen() -> None:
    config = EngineConfig(context_length=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_batch_size = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("context_length", 0, "context_length must be at least 1"),
        ("max_batch_size", 0, "max_batch_size must be at least 1"),
        ("block_size", -16, "block_size must be at least 1"),
        ("max_step_tokens", 0, "max_step_tokens must be at least 1 where given"),
        ("kv_cache_bytes", 0, "kv_cache_bytes must be at least 1 where given"),
        ("max_num_blocks", -1, "max_num_blocks must be at least 1 where given"),
        ("abort_poll_seconds", -0.5, "abort_poll_seconds must not be negative"),
        ("interactive_step_seconds", -1.0, "interactive_step_seconds must not be negative"),
    ],
)
def test_values_no_engine_can_run_with_are_refused(field: str, value: float, message: str) -> None:
    options: dict = {"context_length": 64, field: value}
    with pytest.raises(ValueError, match=message):
        EngineConfig(**options)


def test_zero_turns_the_abort_poll_and_pacing_to_every_step_and_off() -> None:
    config = EngineConfig(context_length=64, abort_poll_seconds=0, interactive_step_seconds=0)
    assert (config.abort_poll_seconds, config.interactive_step_seconds) == (0, 0)
