"""The generation engine on the real tiny demo model: batched results must equal unbatched ones."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from inference.engine import (
    Engine,
    EngineConfig,
    GenerationRequest,
    GenerationResult,
    ModelLoadError,
    SamplingParams,
    load_model,
)
from inference.rendering import render_prompt
from tests.inference.requests_of import greedy, prompt

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
LONG_SYSTEM = (
    "You are the support assistant of a small bakery. Answer in one short paragraph, "
    "mention opening hours only when asked, and never invent prices or products."
)


@pytest.fixture(scope="module")
def model(loaded):
    return loaded[0]


@pytest.fixture(scope="module")
def tokenizer(loaded):
    return loaded[1]


def reference(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Unbatched greedy decoding by transformers itself, end-of-sequence suppressed."""
    out = model.generate(
        torch.tensor([prompt_ids]),
        attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
    )
    return out[0, len(prompt_ids) :].tolist()


def run(engine: Engine, requests, **options) -> dict[str, GenerationResult]:
    return {r.id: r for r in engine.generate(requests, **options)}


def test_load_model_gives_an_eval_fp32_model_and_its_tokenizer(loaded) -> None:
    model, tokenizer = loaded

    assert not model.training
    assert model.dtype == torch.float32
    assert model.device.type == "cpu"
    assert tokenizer.chat_template


def test_load_model_raises_model_load_error_for_missing_weights(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError):
        load_model(str(tmp_path / "nothing-here"))


def test_render_prompt_matches_the_tokenizer_and_keeps_text_parts_only(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is "},
                {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}},
                {"type": "text", "text": "bread?"},
            ],
        },
    ]

    ids = render_prompt(tokenizer, messages)

    plain = [messages[0], {"role": "user", "content": "What is bread?"}]
    expected = tokenizer.apply_chat_template(plain, add_generation_prompt=True, return_dict=False)
    assert ids == list(expected)
    assert tokenizer.decode(ids).endswith(
        "<|im_start|>user\nWhat is bread?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_greedy_equals_model_generate_for_a_single_request(model, tokenizer) -> None:
    ids = prompt(tokenizer, "Tell me about the weather in the mountains.")
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048))

    result = run(engine, [GenerationRequest("a", ids, greedy(24))])["a"]

    assert result.choices[0].token_ids == reference(model, ids, 24)
    assert result.choices[0].text == tokenizer.decode(
        result.choices[0].token_ids, skip_special_tokens=True
    )
    assert result.prompt_tokens == len(ids)


def test_greedy_in_a_mixed_batch_equals_unbatched_generation(model, tokenizer) -> None:
    # Different prompt lengths and budgets through 3 rows: rows finish at different steps and
    # new ones join; the long prompt joining late moves the store right (and grows it), and the
    # last request's 120 tokens reach the end of the store (a move back to the left).
    texts = [
        "Write a short poem about the sea.",
        "Hi.",
        "Why?",
        "Summarize the following text " * 7,
        "Explain lists and tuples in Python, please. " * 3,
        "Thanks!",
    ]
    budgets = [40, 5, 3, 12, 17, 120]
    prompts = [prompt(tokenizer, t) for t in texts]
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=3))

    results = run(
        engine,
        [
            GenerationRequest(str(i), p, greedy(b))
            for i, (p, b) in enumerate(zip(prompts, budgets, strict=True))
        ],
    )

    for i, (p, b) in enumerate(zip(prompts, budgets, strict=True)):
        choice = results[str(i)].choices[0]
        assert choice.token_ids == reference(model, p, b), f"request {i}"
        assert choice.finish_reason == "length"
        assert results[str(i)].completion_tokens == b


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "packed"])
def test_both_decoding_layouts_equal_unbatched_generation(
    model, tokenizer, monkeypatch, padded: bool
) -> None:
    # Rows sharing a system prompt (one block table entry read by several rows) and rows
    # without one, decoded either way: each layout must give transformers' own tokens.
    from inference.engine import runner as runner_module

    chosen: list[bool] = []

    def layout(*args) -> bool:
        chosen.append(padded)
        return padded

    monkeypatch.setattr(runner_module, "_decode_padded", layout)
    prompts = [
        prompt(tokenizer, "When do you open?", system=LONG_SYSTEM),
        prompt(tokenizer, "Hi."),
        prompt(tokenizer, "Do you sell rye bread?", system=LONG_SYSTEM),
        prompt(tokenizer, "A longer question, " * 9),
    ]
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=4))

    results = run(engine, [GenerationRequest(str(i), p, greedy(14)) for i, p in enumerate(prompts)])

    assert chosen  # the decoding steps went through the choice
    for i, p in enumerate(prompts):
        assert results[str(i)].choices[0].token_ids == reference(model, p, 14), f"request {i}"


def test_decoding_layout_pads_only_rows_that_share_nothing_and_are_many() -> None:
    from inference.engine.runner import _decode_padded

    # 32 rows of 100-300 tokens in their own blocks, 16-wide heads: padded.
    lengths = [100 + 200 * i // 31 for i in range(32)]
    tables, next_block = [], 1
    for length in lengths:
        count = -(-length // 16)
        tables.append(list(range(next_block, next_block + count)))
        next_block += count
    assert _decode_padded(tables, lengths, 16, key_width=16)
    # The same rows with 64-wide heads: packed.
    assert not _decode_padded(tables, lengths, 16, key_width=64)
    # The same rows all reading one 500-token prompt's blocks first: packed.
    prefix = list(range(1000, 1032))
    shared = [prefix + t[:2] for t in tables]
    assert not _decode_padded(shared, [512 + 20] * 32, 16, key_width=16)
    # Two rows: packed.
    assert not _decode_padded(tables[:2], lengths[:2], 16, key_width=16)


def test_eager_attention_gets_an_additive_mask_and_the_same_tokens(
    model, tokenizer, tiny_model_dir: Path
) -> None:
    eager = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, local_files_only=True, attn_implementation="eager"
    ).eval()
    prompts = [prompt(tokenizer, "Hi."), prompt(tokenizer, "A longer question, " * 5)]
    engine = Engine(eager, tokenizer, EngineConfig(context_length=2048, max_batch_size=2))

    results = run(engine, [GenerationRequest(str(i), p, greedy(12)) for i, p in enumerate(prompts)])

    for i, p in enumerate(prompts):
        assert results[str(i)].choices[0].token_ids == reference(model, p, 12)


def test_shared_prefix_is_reused_and_reported_as_cached(model, tokenizer) -> None:
    first = prompt(tokenizer, "When do you open?", system=LONG_SYSTEM)
    second = prompt(tokenizer, "Do you sell rye bread?", system=LONG_SYSTEM)
    third = prompt(tokenizer, "Unrelated.", system=None)
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert shared >= 32
    # Two rows: "second" joins while "first" is still running and reads its prefix's blocks.
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=2))

    results = run(
        engine,
        [
            GenerationRequest("first", first, greedy(20)),
            GenerationRequest("third", third, greedy(2)),
            GenerationRequest("second", second, greedy(8)),
            GenerationRequest("again", first, greedy(6)),
        ],
    )

    block = engine.block_size  # the cache serves whole blocks of tokens
    assert results["first"].cached_tokens == 0
    assert results["second"].cached_tokens == shared // block * block
    assert results["again"].cached_tokens == (len(first) - 1) // block * block
    assert results["second"].choices[0].token_ids == reference(model, second, 8)
    assert results["again"].choices[0].token_ids == reference(model, first, 6)


def test_a_prefix_shared_by_rows_admitted_together_is_computed_once(model, tokenizer) -> None:
    system = LONG_SYSTEM * 4  # several blocks, longer than one step's prompt budget below
    prompts = [prompt(tokenizer, f"Question number {i}?", system=system) for i in range(12)]
    shared = next(i for i, (a, b) in enumerate(zip(prompts[0], prompts[1], strict=False)) if a != b)
    # All twelve rows are admitted in the first step; the budget splits the prefix over steps.
    engine = Engine(
        model, tokenizer, EngineConfig(context_length=2048, max_batch_size=12, max_step_tokens=64)
    )

    results = run(engine, [GenerationRequest(str(i), p, greedy(3)) for i, p in enumerate(prompts)])

    block = engine.block_size
    assert shared > 2 * 64
    assert results["0"].cached_tokens == 0
    # Every other row waited for the first one's blocks instead of computing them again.
    assert [results[str(i)].cached_tokens for i in range(1, 12)] == [shared // block * block] * 11
    for i in (1, 11):
        assert results[str(i)].choices[0].token_ids == reference(model, prompts[i], 3)


def test_prefix_reuse_never_crosses_cache_scopes(model, tokenizer) -> None:
    ids = prompt(tokenizer, "When do you open?", system=LONG_SYSTEM)
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=2))

    results = run(
        engine,
        [
            GenerationRequest("org-a", ids, greedy(12), cache_scope="org-a"),
            GenerationRequest("org-b", ids, greedy(4), cache_scope="org-b"),
            GenerationRequest("org-a-again", ids, greedy(4), cache_scope="org-a"),
        ],
    )

    assert results["org-a"].cached_tokens == 0
    assert results["org-b"].cached_tokens == 0  # same prompt, other scope: computed afresh
    assert results["org-a-again"].cached_tokens > 0
    assert results["org-b"].choices[0].token_ids == reference(model, ids, 4)


def test_n_choices_share_one_prefill(model, tokenizer) -> None:
    ids = prompt(tokenizer, "Tell me a story.")
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048))

    results = run(
        engine,
        [
            GenerationRequest("greedy", ids, greedy(10, n=3)),
            GenerationRequest(
                "sampled", ids, SamplingParams(max_new_tokens=10, n=3, seed=5, ignore_eos=True)
            ),
        ],
    )

    expected = reference(model, ids, 10)
    assert [c.index for c in results["greedy"].choices] == [0, 1, 2]
    assert all(c.token_ids == expected for c in results["greedy"].choices)
    sampled = results["sampled"]
    assert sampled.prompt_tokens == len(ids)
    assert sampled.completion_tokens == 30
    assert len({tuple(c.token_ids) for c in sampled.choices}) == 3


def test_seeded_sampling_is_reproducible_whatever_the_batch_mates(model, tokenizer) -> None:
    ids = prompt(tokenizer, "Give me a word.")
    params = SamplingParams(
        max_new_tokens=16, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True
    )
    alone = run(
        Engine(model, tokenizer, EngineConfig(context_length=2048)),
        [GenerationRequest("x", ids, params)],
    )
    mates = [
        GenerationRequest(
            f"m{i}", prompt(tokenizer, "Other text " * i), SamplingParams(max_new_tokens=4 + i)
        )
        for i in range(1, 6)
    ]
    crowded = run(
        Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=4)),
        [*mates[:3], GenerationRequest("x", ids, params), *mates[3:]],
    )
    other_seed = run(
        Engine(model, tokenizer, EngineConfig(context_length=2048)),
        [GenerationRequest("x", ids, replace(params, seed=99))],
    )

    assert crowded["x"].choices[0].token_ids == alone["x"].choices[0].token_ids
    assert other_seed["x"].choices[0].token_ids != alone["x"].choices[0].token_ids


def test_tiny_top_p_is_greedy(model, tokenizer) -> None:
    ids = prompt(tokenizer, "Hello")
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=1e-6, ignore_eos=True)

    result = run(
        Engine(model, tokenizer, EngineConfig(context_length=2048)),
        [GenerationRequest("a", ids, params)],
    )

    assert result["a"].choices[0].token_ids == reference(model, ids, 12)


def test_logit_bias_and_presence_penalty_steer_the_choice(model, tokenizer) -> None:
    ids = prompt(tokenizer, "Hello")
    forced = tokenizer.convert_tokens_to_ids("the")
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048))

    results = run(
        engine,
        [
            GenerationRequest("bias", ids, greedy(6, logit_bias={forced: 100.0})),
            GenerationRequest("presence", ids, greedy(30, presence_penalty=100.0)),
            GenerationRequest("frequency", ids, greedy(30, frequency_penalty=100.0)),
        ],
    )

    assert results["bias"].choices[0].token_ids == [forced] * 6
    for name in ("presence", "frequency"):
        tokens = results[name].choices[0].token_ids
        assert len(set(tokens)) == len(tokens)  # a repeated token would have paid 100
    assert len(set(reference(model, ids, 30))) < 30  # unpenalized, it repeats itself


def test_end_of_sequence_stops_with_reason_stop(model, tokenizer) -> None:
    ids = prompt(tokenizer, "Hello")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    params = SamplingParams(max_new_tokens=10, temperature=0.0, logit_bias={im_end: 100.0})

    result = run(
        Engine(model, tokenizer, EngineConfig(context_length=2048)),
        [GenerationRequest("a", ids, params)],
    )["a"]

    assert result.choices[0].token_ids == [im_end]
    assert result.choices[0].finish_reason == "stop"
    assert result.choices[0].text == ""
    assert result.completion_tokens == 1


def test_max_new_tokens_ends_with_reason_length(model, tokenizer) -> None:
    ids = prompt(tokenizer, "Hello")

    result = run(
        Engine(model, tokenizer, EngineConfig(context_length=2048)),
        [GenerationRequest("a", ids, greedy(7))],
    )["a"]

    assert result.choices[0].finish_reason == "length"
    assert result.completion_tokens == len(result.choices[0].token_ids) == 7


def test_stop_string_ends_generation_and_is_trimmed(model, tokenizer) -> None:
    ids = prompt(tokenizer, "Tell me about the weather in the mountains.")
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048))
    full = run(engine, [GenerationRequest("a", ids, greedy(40))])["a"].choices[0]
    # A stop string taken from the middle of the unconstrained output.
    start = next(
        i for i in range(len(full.text) // 3, len(full.text) - 2) if full.text[i : i + 2].isalpha()
    )
    stop = full.text[start : start + 2]

    stopped = run(engine, [GenerationRequest("a", ids, greedy(40, stop=("zzzz", stop)))])[
        "a"
    ].choices[0]

    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[: full.text.find(stop)]
    assert stopped.token_ids == full.token_ids[: len(stopped.token_ids)]
    assert len(stopped.token_ids) < 40


def test_context_length_violation_is_an_immediate_error(model, tokenizer) -> None:
    ids = prompt(tokenizer, "Hello")
    engine = Engine(model, tokenizer, EngineConfig(context_length=len(ids) + 5))

    results = list(
        engine.generate(
            [GenerationRequest("ok", ids, greedy(5)), GenerationRequest("long", ids, greedy(6))]
        )
    )

    assert [r.id for r in results] == ["long", "ok"]  # the error does not wait for generation
    assert results[0].error == "context_length_exceeded"
    assert results[0].choices == [] and results[0].completion_tokens == 0
    assert results[1].error is None and results[1].completion_tokens == 5


def test_aborted_requests_stop_and_the_others_are_unaffected(model, tokenizer) -> None:
    prompts = {name: prompt(tokenizer, f"Request {name}, please.") for name in "abcd"}
    polls = 0

    def aborted() -> set[str]:
        nonlocal polls
        polls += 1
        # "b" is cancelled mid-flight; "d" before it ever started.
        return {"b", "d"} if polls > 3 else {"d"}

    engine = Engine(
        model, tokenizer, EngineConfig(context_length=2048, max_batch_size=3, abort_poll_seconds=0)
    )
    results = run(
        engine,
        [GenerationRequest(name, p, greedy(25)) for name, p in prompts.items()],
        aborted=aborted,
    )

    assert results["b"].aborted and results["b"].choices == []
    assert results["d"].aborted and results["d"].busy_seconds == 0
    for name in "ac":
        assert not results[name].aborted
        assert results[name].choices[0].token_ids == reference(model, prompts[name], 25)


def test_requests_are_pulled_lazily_as_rows_free_up(model, tokenizer) -> None:
    ids = prompt(tokenizer, "Hello")
    pulled = 0

    def source() -> Iterator[GenerationRequest]:
        nonlocal pulled
        for i in range(12):
            pulled += 1
            yield GenerationRequest(str(i), ids, greedy(3 + i % 4))

    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=4))
    stream = engine.generate(source())
    first = next(stream)
    pulled_before_first = pulled
    rest = list(stream)

    assert pulled_before_first <= 4
    assert {r.id for r in [first, *rest]} == {str(i) for i in range(12)}


def test_busy_time_shares_add_up_to_the_engine_busy_time(model, tokenizer) -> None:
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=3))
    requests = [
        GenerationRequest(str(i), prompt(tokenizer, "x " * i), greedy(4 + i, n=1 + i % 2))
        for i in range(7)
    ]

    results = run(engine, requests)

    assert all(r.busy_seconds > 0 for r in results.values())
    assert sum(r.busy_seconds for r in results.values()) == pytest.approx(
        engine.busy_seconds_total, rel=1e-9
    )


def test_invalid_requests_are_errors_not_exceptions(model, tokenizer) -> None:
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=4))

    results = run(
        engine,
        [
            GenerationRequest("empty", [], greedy(3)),
            GenerationRequest("n", [1, 2], greedy(3, n=5)),
            GenerationRequest("zero", [1, 2], greedy(0)),
        ],
    )

    assert {r.error for r in results.values()} == {"invalid_request"}


def test_a_prompt_token_outside_the_vocabulary_is_refused_and_the_rest_run(
    model, tokenizer
) -> None:
    engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=4))
    vocab = model.get_output_embeddings().weight.shape[0]
    prompt = tokenizer("Hello there")["input_ids"]

    results = run(
        engine,
        [
            GenerationRequest("past", [*prompt, vocab], greedy(3)),
            GenerationRequest("negative", [-1, *prompt], greedy(3)),
            GenerationRequest("fine", prompt, greedy(3)),
        ],
    )

    assert results["past"].error == results["negative"].error == "invalid_request"
    assert results["past"].completion_tokens == results["negative"].completion_tokens == 0
    assert results["fine"].error is None and results["fine"].completion_tokens == 3


def test_engine_package_does_not_import_django() -> None:
    code = (
        "import sys, inference.engine\n"
        "leaked = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'))\n"
        "assert not leaked, leaked\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_a_request_whose_forward_raises_fails_alone(model, tokenizer) -> None:
    good = [prompt(tokenizer, f"Question number {i}?") for i in range(3)]
    poison = 599  # a token id that only the bad prompt carries
    bad = [*prompt(tokenizer, "Poisoned."), poison, *prompt(tokenizer, "More.")]
    assert all(poison not in p for p in good)

    def explode(module, args):
        ids = args[0]
        if ids.shape[1] > 1 and bool((ids == poison).any()):
            raise ValueError("injected failure")

    hook = model.get_input_embeddings().register_forward_pre_hook(explode)
    try:
        engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=4))
        results = run(
            engine,
            [
                GenerationRequest("g0", good[0], greedy(8)),
                GenerationRequest("bad", bad, greedy(8)),
                GenerationRequest("g1", good[1], greedy(8)),
                GenerationRequest("g2", good[2], greedy(8)),
            ],
        )
    finally:
        hook.remove()

    assert results["bad"].error == "internal_error"
    assert results["bad"].choices == [] and results["bad"].completion_tokens == 0
    for i, p in enumerate(good):
        assert results[f"g{i}"].error is None
        assert results[f"g{i}"].choices[0].token_ids == reference(model, p, 8)
    assert sum(r.busy_seconds for r in results.values()) == pytest.approx(
        engine.busy_seconds_total, rel=1e-9
    )


def test_a_request_whose_decoding_raises_fails_alone(model, tokenizer) -> None:
    ids = prompt(tokenizer, "Hello")
    others = [prompt(tokenizer, f"Another question, {i}.") for i in range(2)]
    expected = [reference(model, p, 10) for p in others]
    cursed = next(t for t in range(100, 600) if all(t not in e for e in expected))

    class Flaky:
        """The real tokenizer, except that decoding the cursed token raises."""

        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def __len__(self) -> int:
            return len(tokenizer)

        def decode(self, tokens, **options):
            if cursed in tokens:
                raise RuntimeError("injected failure")
            return tokenizer.decode(tokens, **options)

    engine = Engine(model, Flaky(), EngineConfig(context_length=2048, max_batch_size=3))
    results = run(
        engine,
        [
            GenerationRequest("o0", others[0], greedy(10)),
            GenerationRequest("bad", ids, greedy(10, logit_bias={cursed: 100.0}, stop=("q",))),
            GenerationRequest("o1", others[1], greedy(10)),
        ],
    )

    assert results["bad"].error == "internal_error" and results["bad"].choices == []
    for i, e in enumerate(expected):
        assert results[f"o{i}"].choices[0].token_ids == e


def test_out_of_memory_shrinks_the_step_and_everything_completes(model, tokenizer) -> None:
    prompts = [prompt(tokenizer, f"Tell me about item {i}.") for i in range(6)]
    raised = 0

    def too_big(module, args):
        nonlocal raised
        if args[0].numel() > 8:  # more than eight tokens in one forward do not fit
            raised += 1
            raise torch.OutOfMemoryError("injected: out of memory")

    hook = model.get_input_embeddings().register_forward_pre_hook(too_big)
    try:
        engine = Engine(model, tokenizer, EngineConfig(context_length=2048, max_batch_size=4))
        results = run(
            engine, [GenerationRequest(str(i), p, greedy(12)) for i, p in enumerate(prompts)]
        )
    finally:
        hook.remove()

    assert raised > 0
    for i, p in enumerate(prompts):
        assert results[str(i)].error is None
        assert results[str(i)].choices[0].token_ids == reference(model, p, 12)


def test_a_batch_larger_than_the_kv_memory_completes(model, tokenizer) -> None:
    prompts = [prompt(tokenizer, f"Describe the colour number {i}, please.") for i in range(6)]
    engine = Engine(
        model,
        tokenizer,
        EngineConfig(context_length=2048, max_batch_size=4, block_size=16, max_num_blocks=14),
    )
    budget = 60
    total_blocks = sum(-(-(len(p) + budget) // 16) for p in prompts)
    assert total_blocks > 2 * engine._blocks.num_blocks  # far more than fits at once

    results = run(
        engine, [GenerationRequest(str(i), p, greedy(budget)) for i, p in enumerate(prompts)]
    )

    for i, p in enumerate(prompts):
        assert results[str(i)].error is None, results[str(i)].error
        assert results[str(i)].choices[0].token_ids == reference(model, p, budget)
    assert engine._blocks.available == engine._blocks.num_blocks - 1  # every block came back


def test_a_request_that_could_never_fit_is_refused_not_run(model, tokenizer) -> None:
    ids = prompt(tokenizer, "Hello")
    engine = Engine(
        model, tokenizer, EngineConfig(context_length=2048, max_num_blocks=4, block_size=16)
    )

    result = run(engine, [GenerationRequest("big", ids, greedy(100))])["big"]

    assert result.error == "context_length_exceeded" and result.choices == []


def test_long_prompts_are_prefilled_in_chunks_beside_decoding_rows(model, tokenizer) -> None:
    short = prompt(tokenizer, "Hi.")
    long = prompt(tokenizer, "A long question about many things, " * 12)
    assert len(long) > 4 * 16
    # A budget of 16 tokens a step: the long prompt takes several steps while "short" decodes.
    engine = Engine(
        model, tokenizer, EngineConfig(context_length=2048, max_batch_size=2, max_step_tokens=16)
    )

    results = run(
        engine,
        [GenerationRequest("short", short, greedy(30)), GenerationRequest("long", long, greedy(5))],
    )

    assert results["short"].choices[0].token_ids == reference(model, short, 30)
    assert results["long"].choices[0].token_ids == reference(model, long, 5)


def test_prefix_cache_outlives_its_request_and_can_be_turned_off(model, tokenizer) -> None:
    ids = prompt(tokenizer, "When do you open?", system=LONG_SYSTEM)
    other = prompt(tokenizer, "Do you sell rye bread?", system=LONG_SYSTEM)
    cached = Engine(model, tokenizer, EngineConfig(context_length=2048))
    uncached = Engine(model, tokenizer, EngineConfig(context_length=2048, prefix_cache=False))

    for engine in (cached, uncached):
        run(engine, [GenerationRequest("first", ids, greedy(3))])  # a call of its own, ended
    later = run(cached, [GenerationRequest("later", other, greedy(6))])["later"]
    fresh = run(uncached, [GenerationRequest("later", other, greedy(6))])["later"]

    assert later.cached_tokens >= 32
    assert fresh.cached_tokens == 0
    assert later.choices[0].token_ids == fresh.choices[0].token_ids == reference(model, other, 6)
