"""Tiny random-weight models of families whose attention caches keys and values differently:
the engine must generate token for token what `model.generate` gives one prompt at a time,
with the prefix cache on and off, under forced preemption, with chunked prefill and n > 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    FalconConfig,
    FalconForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from inference.engine import Engine, GenerationRequest, SamplingParams, load_model
from tests.inference.test_engine import reference

pytestmark = pytest.mark.model

CONTEXT = 256
# Wide enough weights that greedy decoding does not settle on one token at once.
INIT = {"initializer_range": 0.3, "attn_implementation": "sdpa"}
SMALL = {"num_hidden_layers": 2, "num_attention_heads": 4}


def _falcon(vocab: int, **options: Any) -> Any:
    config = FalconConfig(
        vocab_size=vocab,
        hidden_size=64,
        max_position_embeddings=CONTEXT,
        alibi=False,
        **SMALL,
        **INIT,
        **options,
    )
    return FalconForCausalLM(config)


FAMILIES = {
    # Multi-query: one cached K/V head, and no num_key_value_heads in the config.
    "falcon-multi-query": lambda v: _falcon(v, multi_query=True, new_decoder_architecture=False),
    "falcon-multi-head": lambda v: _falcon(v, multi_query=False, new_decoder_architecture=False),
    # New decoder architecture: grouped K/V projected, but every query head cached.
    "falcon-new-decoder": lambda v: _falcon(v, new_decoder_architecture=True, num_kv_heads=2),
    "llama-grouped-query": lambda v: LlamaForCausalLM(
        LlamaConfig(
            vocab_size=v,
            hidden_size=64,
            intermediate_size=128,
            num_key_value_heads=2,
            max_position_embeddings=CONTEXT,
            **SMALL,
            **INIT,
        )
    ),
    "gpt2": lambda v: GPT2LMHeadModel(
        GPT2Config(vocab_size=v, n_embd=64, n_layer=2, n_head=4, n_positions=CONTEXT, **INIT)
    ),
}

SETTINGS = {
    "prefix-cache": {"prefix_cache": True},
    "no-prefix-cache": {"prefix_cache": False},
    # 24 blocks of 4 tokens: the three rows (up to 66 tokens each) cannot all be held at once.
    "preemption": {"max_num_blocks": 24},
    "chunked-prefill": {"max_step_tokens": 8},
}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return load_model(str(tiny_model_dir))[1]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tokenizer: Any) -> Any:
    torch.manual_seed(0)
    model = FAMILIES[request.param](len(tokenizer)).eval()
    # The configs' default end-of-sequence ids (GPT-2's 50256) lie outside this vocabulary.
    model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def _prompts(vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    shared = torch.randint(3, vocab, (13,), generator=generator).tolist()
    tails = [torch.randint(3, vocab, (k,), generator=generator).tolist() for k in (9, 30, 1)]
    return [shared + tail for tail in tails]  # a prefix shared across block boundaries


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_each_family_generates_what_model_generate_gives(family, tokenizer, setting: str) -> None:
    prompts = _prompts(len(tokenizer))
    tokens = 20
    engine = Engine(
        family,
        tokenizer,
        context_length=CONTEXT,
        max_batch_size=4,
        block_size=4,
        **SETTINGS[setting],
    )
    params = SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
    requests = [GenerationRequest(str(i), p, params) for i, p in enumerate(prompts)]

    if setting == "preemption":  # far more blocks than the memory holds at once
        needed = sum(-(-(len(p) + tokens) // 4) for p in prompts)
        assert needed > engine._blocks.num_blocks

    results = {r.id: r for r in engine.generate(requests)}

    for i, p in enumerate(prompts):
        result = results[str(i)]
        assert result.error is None, result.error
        assert result.choices[0].token_ids == reference(family, p, tokens), f"prompt {i}"


def test_each_familys_n_choices_share_one_prefill_and_match(family, tokenizer) -> None:
    prompt = _prompts(len(tokenizer))[1]
    engine = Engine(family, tokenizer, context_length=CONTEXT, max_batch_size=4, block_size=4)
    params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True, n=3)

    [result] = engine.generate([GenerationRequest("n", prompt, params)])

    assert result.error is None, result.error
    expected = reference(family, prompt, 12)
    assert [c.token_ids for c in result.choices] == [expected] * 3
