"""The family matrix: a tiny random-weight model of every family the engine serves must
generate token for token what `model.generate` gives one prompt at a time, with the prefix
cache on and off, under forced preemption, with chunked prefill and with n > 1, and report
log probabilities within 1e-4 of the reference logits' log-softmax.

Families with sliding windows (Mistral, Qwen2, Gemma 2 and 3, GPT-OSS) get an 8-token window
and prompts up to 43 tokens, so every prompt and every decoding step reaches past it; Gemma 2
soft-caps its scores, GPT-OSS has attention sinks and experts, Mixtral and Qwen3-MoE experts,
Falcon caches one K/V head (multi-query) or every query head (new decoder architecture).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers as tf

from inference.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, load_model

pytestmark = pytest.mark.model

CONTEXT = 256
WINDOW = 8
TOKENS = 20
# Wide enough weights that greedy decoding does not settle on one token at once.
INIT = {"initializer_range": 0.3, "attn_implementation": "sdpa"}
SMALL = {"num_hidden_layers": 2, "num_attention_heads": 4}
# The decoder families' common shape: grouped-query (2 K/V heads for 4 query heads).
DECODER = {
    **SMALL,
    **INIT,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": CONTEXT,
}
# Gemma scales its embeddings up: with wide weights its greedy output repeats one token.
GEMMA = {**DECODER, "initializer_range": 0.02, "sliding_window": WINDOW}
ALTERNATING = ["sliding_attention", "full_attention"]
EXPERTS = {"num_local_experts": 4, "num_experts_per_tok": 2}


def _falcon(**options: Any) -> tf.PreTrainedConfig:
    return tf.FalconConfig(
        hidden_size=64, max_position_embeddings=CONTEXT, alibi=False, **SMALL, **INIT, **options
    )


Build = tuple[type, Callable[[], tf.PreTrainedConfig]]
FAMILIES: dict[str, Build] = {
    "llama-grouped-query": (tf.LlamaForCausalLM, lambda: tf.LlamaConfig(**DECODER)),
    "mistral-window": (
        tf.MistralForCausalLM,
        lambda: tf.MistralConfig(**DECODER, sliding_window=WINDOW),
    ),
    # Qwen2's window on the layers from max_window_layers on: one full layer, one sliding.
    "qwen2-window": (
        tf.Qwen2ForCausalLM,
        lambda: tf.Qwen2Config(
            **DECODER, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
        ),
    ),
    "qwen3": (tf.Qwen3ForCausalLM, lambda: tf.Qwen3Config(**DECODER)),
    "phi3": (
        tf.Phi3ForCausalLM,
        lambda: tf.Phi3Config(
            **{k: v for k, v in DECODER.items() if k != "head_dim"}, pad_token_id=None
        ),
    ),
    # Soft-capped scores (eager: SDPA cannot cap), alternating local and global layers.
    "gemma2-softcap-window": (
        tf.Gemma2ForCausalLM,
        lambda: tf.Gemma2Config(**{**GEMMA, "attn_implementation": "eager"}),
    ),
    "gemma3-window": (
        tf.Gemma3ForCausalLM,
        lambda: tf.Gemma3TextConfig(**GEMMA, layer_types=ALTERNATING),
    ),
    # Sinks, experts, alternating 8-token windows (GPT-OSS's are 128).
    "gpt-oss-sinks-window-experts": (
        tf.GptOssForCausalLM,
        lambda: tf.GptOssConfig(
            **{**DECODER, "attn_implementation": "eager"},
            sliding_window=WINDOW,
            layer_types=ALTERNATING,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            **EXPERTS,
        ),
    ),
    "mixtral-experts": (tf.MixtralForCausalLM, lambda: tf.MixtralConfig(**DECODER, **EXPERTS)),
    "qwen3-moe-experts": (
        tf.Qwen3MoeForCausalLM,
        lambda: tf.Qwen3MoeConfig(
            **DECODER, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
        ),
    ),
    "gpt2": (
        tf.GPT2LMHeadModel,
        lambda: tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=CONTEXT, **INIT),
    ),
    "gpt-neox": (
        tf.GPTNeoXForCausalLM,
        lambda: tf.GPTNeoXConfig(
            hidden_size=64, intermediate_size=128, max_position_embeddings=CONTEXT, **SMALL, **INIT
        ),
    ),
    "opt": (
        tf.OPTForCausalLM,
        lambda: tf.OPTConfig(
            hidden_size=64,
            ffn_dim=128,
            word_embed_proj_dim=64,
            max_position_embeddings=CONTEXT,
            **SMALL,
            **INIT,
        ),
    ),
    "gptj": (
        tf.GPTJForCausalLM,
        lambda: tf.GPTJConfig(
            n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=CONTEXT, **INIT
        ),
    ),
    # Multi-query: one cached K/V head, and no num_key_value_heads in the config.
    "falcon-multi-query": (
        tf.FalconForCausalLM,
        lambda: _falcon(multi_query=True, new_decoder_architecture=False),
    ),
    "falcon-multi-head": (
        tf.FalconForCausalLM,
        lambda: _falcon(multi_query=False, new_decoder_architecture=False),
    ),
    # New decoder architecture: grouped K/V projected, but every query head cached.
    "falcon-new-decoder": (
        tf.FalconForCausalLM,
        lambda: _falcon(new_decoder_architecture=True, num_kv_heads=2),
    ),
}
WINDOWED = [name for name in FAMILIES if "window" in name]

SETTINGS = {
    "prefix-cache": {"prefix_cache": True},
    "no-prefix-cache": {"prefix_cache": False},
    # 24 blocks of 4 tokens: the three rows (up to 63 tokens each) cannot all be held at once.
    "preemption": {"max_num_blocks": 24},
    "chunked-prefill": {"max_step_tokens": 8},
}


class Family:
    """A family's model and its reference: `model.generate`, one prompt at a time."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._references: dict[tuple[int, ...], tuple[list[int], list[float]]] = {}

    def reference(self, prompt: list[int], tokens: int = TOKENS) -> tuple[list[int], list[float]]:
        """Greedy tokens (end of sequence suppressed) and each one's log-softmax."""
        key = (*prompt, -tokens)
        if key not in self._references:
            out = self.model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
            ids = out.sequences[0, len(prompt) :].tolist()
            # The raw logits; end of sequence is banned, as the engine bans it (ignore_eos).
            logprobs = []
            for step, token in zip(out.logits, ids, strict=True):
                row = step[0].float()
                row[self.model.generation_config.eos_token_id] = float("-inf")
                logprobs.append(float(torch.log_softmax(row, -1)[token]))
            self._references[key] = (ids, logprobs)
        return self._references[key]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return load_model(str(tiny_model_dir))[1]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, tokenizer: Any) -> Family:
    model_class, config = FAMILIES[request.param]
    torch.manual_seed(0)
    built = config()
    built.vocab_size = len(tokenizer)
    model = model_class(built).eval()
    # The configs' default end-of-sequence ids (GPT-2's 50256) lie outside this vocabulary.
    model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
    return Family(model)


def _prompts(vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    shared = torch.randint(3, vocab, (13,), generator=generator).tolist()
    tails = [torch.randint(3, vocab, (k,), generator=generator).tolist() for k in (9, 30, 1)]
    return [shared + tail for tail in tails]  # a prefix shared across block boundaries


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_each_family_generates_what_model_generate_gives(
    family: Family, tokenizer: Any, setting: str
) -> None:
    prompts = _prompts(len(tokenizer))
    config = EngineConfig(
        context_length=CONTEXT, max_batch_size=4, block_size=4, **SETTINGS[setting]
    )
    engine = Engine(family.model, tokenizer, config)
    params = SamplingParams(max_new_tokens=TOKENS, temperature=0.0, ignore_eos=True, logprobs=True)
    requests = [GenerationRequest(str(i), p, params) for i, p in enumerate(prompts)]

    if setting == "preemption":  # far more blocks than the memory holds at once
        needed = sum(-(-(len(p) + TOKENS) // 4) for p in prompts)
        assert needed > engine._blocks.num_blocks

    results = {r.id: r for r in engine.generate(requests)}

    for i, p in enumerate(prompts):
        result = results[str(i)]
        assert result.error is None, result.error
        expected, logprobs = family.reference(p)
        choice = result.choices[0]
        assert choice.token_ids == expected, f"prompt {i}"
        assert choice.logprobs is not None
        got = [entry.logprob for entry in choice.logprobs]
        assert got == pytest.approx(logprobs, abs=1e-4), f"prompt {i}"


def test_each_familys_n_choices_share_one_prefill_and_match(family: Family, tokenizer) -> None:
    prompt = _prompts(len(tokenizer))[1]
    engine = Engine(
        family.model,
        tokenizer,
        EngineConfig(context_length=CONTEXT, max_batch_size=4, block_size=4),
    )
    params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True, n=3)

    [result] = engine.generate([GenerationRequest("n", prompt, params)])

    assert result.error is None, result.error
    expected, _ = family.reference(prompt, 12)
    assert [c.token_ids for c in result.choices] == [expected] * 3


@pytest.mark.parametrize("name", WINDOWED)
def test_the_windows_change_what_these_prompts_generate(name: str, tokenizer) -> None:
    """Without this the matrix would not show that windows are honoured: with the window
    opened to the whole context, the reference generates other tokens."""
    model_class, config = FAMILIES[name]
    outputs = []
    for window in (WINDOW, CONTEXT):
        torch.manual_seed(0)
        built = config()
        built.vocab_size, built.sliding_window = len(tokenizer), window
        outputs.append(Family(model_class(built).eval()).reference(_prompts(len(tokenizer))[1]))
    assert outputs[0][0] != outputs[1][0]


def test_alibi_is_refused_when_the_engine_is_built_not_row_by_row(tokenizer) -> None:
    built = _falcon()
    built.vocab_size, built.alibi = len(tokenizer), True
    with pytest.raises(ValueError, match="Falcon with ALiBi positions"):
        Engine(tf.FalconForCausalLM(built).eval(), tokenizer, EngineConfig(context_length=CONTEXT))


def _built(name: str, tokenizer: Any) -> Any:
    model_class, config = FAMILIES[name]
    torch.manual_seed(0)
    built = config()
    built.vocab_size = len(tokenizer)
    return model_class(built).eval()


@pytest.mark.parametrize(
    ("name", "window"),
    [
        ("mistral-window", WINDOW),
        ("qwen2-window", None),  # one full layer
        ("gemma3-window", None),  # alternating local and global layers
        ("gpt-oss-sinks-window-experts", None),
        ("llama-grouped-query", None),
    ],
)
def test_blocks_are_given_back_early_only_where_every_layer_has_a_window(
    name: str, window: int | None, tokenizer: Any
) -> None:
    """The window comes from what each layer's attention asks for, not from the config (Qwen2
    and Gemma name one but keep full layers that read every key)."""
    engine = Engine(
        _built(name, tokenizer), tokenizer, EngineConfig(context_length=CONTEXT, block_size=4)
    )
    assert engine._blocks.window == window


def test_blocks_out_of_every_window_go_back_so_more_rows_fit_at_once(tokenizer) -> None:
    """Mistral with an 8-token window: three rows of up to 83 tokens need 63 blocks of 4 at
    full length, the memory holds 24. With the blocks behind the window given back they run
    without a preemption; holding every block they must be preempted. Both generate token for
    token what `model.generate` gives, so a block given back was never read again."""
    model = _built("mistral-window", tokenizer)
    family = Family(model)
    prompts = _prompts(len(tokenizer))
    tokens = 40
    params = SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
    preemptions = {}
    for sliding in (True, False):
        engine = Engine(
            model,
            tokenizer,
            EngineConfig(context_length=CONTEXT, max_batch_size=4, block_size=4, max_num_blocks=24),
        )
        if not sliding:
            engine._blocks.window = None
        resets = []
        reset = engine._blocks.reset
        engine._blocks.reset = lambda seq, reset=reset, resets=resets: (  # type: ignore[method-assign]
            resets.append(seq),
            reset(seq),
        )
        results = {
            r.id: r
            for r in engine.generate(
                [GenerationRequest(str(i), p, params) for i, p in enumerate(prompts)]
            )
        }
        for i, p in enumerate(prompts):
            assert results[str(i)].error is None
            assert results[str(i)].choices[0].token_ids == family.reference(p, tokens)[0]
        pool = engine._blocks.pool
        assert pool.held == 0 and min(pool.refs) == 0  # every block given back once, none twice
        preemptions[sliding] = len(resets)
    assert sum(-(-(len(p) + tokens) // 4) for p in prompts) > 24
    assert preemptions == {True: 0, False: preemptions[False]} and preemptions[False] > 0
