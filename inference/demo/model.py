"""The demo model: a small Llama-architecture chat model built offline, with random weights.

Nothing is downloaded: the tokenizer is a byte-level BPE trained in well under a second on the
text embedded below, and the weights come from a fixed seed, so two builds of the same size are
identical. It talks nonsense; it exists so that the whole platform (and its tests and benchmarks)
runs real generation on any machine without network access.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CONTEXT_LENGTH = 2048
MARKER = "boardwalk-demo-model.json"
BUILD_VERSION = 2  # 2: the chat template renders tools and tool calls

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

# ChatML. Content is a string or a list of parts; text parts are joined, other parts dropped
# (the upload validator refuses them for a text-only revision before they get here). Tools are
# listed in a system turn of their own; tool calls use the "hermes" syntax
# (inference/structured.py): one `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`
# block per call, and tool results come back as `tool` turns.
CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\nYou may call these functions:\\n<tools>\\n' -}}"
    "{%- for tool in tools -%}{{- tool | tojson -}}{{- '\\n' -}}{%- endfor -%}"
    "{{- '</tools>\\nTo call one, reply with <tool_call>\\n"
    '{"name": <name>, "arguments": <arguments>}\\n</tool_call><|im_end|>\\n\' -}}'
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- elif message['content'] is not none -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{%- if not loop.first or message['content'] -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": ' + (call['function']['name'] | tojson) -}}"
    "{{- ', \"arguments\": ' -}}"
    "{%- if call['function']['arguments'] is string -%}{{- call['function']['arguments'] -}}"
    "{%- else -%}{{- call['function']['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@dataclass(frozen=True)
class DemoSize:
    vocab_size: int  # target for the BPE trainer; the model uses the tokenizer's real length
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int


SIZES: dict[str, DemoSize] = {
    # A few MB: builds and loads in about a second, for tests.
    "tiny": DemoSize(
        vocab_size=640,
        hidden_size=64,
        intermediate_size=172,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
    ),
    # About 30M parameters, for benchmarks.
    "bench": DemoSize(
        vocab_size=2000,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
    ),
    # The shape of Llama-3.2-1B (hidden 2048, 16 layers, grouped-query attention 32/8) with the
    # demo vocabulary: ~0.98B parameters, stored in bf16 (~2 GB), for the GPU benchmarks.
    # Random weights built on the spot: nothing is downloaded.
    "1b": DemoSize(
        vocab_size=2000,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
    ),
}
# Sizes whose weights are stored in bf16 (half the disk and load time; fp32 buys nothing there).
_STORED_BF16 = frozenset({"1b"})

_SEED = 20261130
_LOGIT_STD = 3.0

_CORPUS = """\
The batch service reads a file of requests, runs each one through a language model, and writes
the answers to a second file in the same order. Nobody waits at the other end of a socket, so the
work can be packed tightly: many sequences share every step of the model, and a new request takes
the place of one that has just finished. That is why a batch costs half as much as a live call.

A good morning starts with bread, butter and a pot of strong tea. My grandmother baked on Sundays;
the kitchen smelled of yeast and cinnamon, and the radio played old songs about rivers and trains.
She said that patience is the secret of good bread, and also of most other things worth doing.

The weather turned cold in the evening. Clouds came in from the west, the wind picked up, and the
first drops of rain hit the window just after seven. By midnight the streets were shining under
the lamps, and the only sound was water running in the gutters toward the harbour.

How do I reset my password? Open the settings page, choose security, and follow the link that we
send to your email address. The link is valid for one hour. If you did not ask for a new password,
you can ignore the message; your account stays exactly as it was.

Please summarize the following text in two sentences. Translate this paragraph into French.
Write a short poem about the sea. Explain the difference between a list and a tuple in Python.
What is the capital of Australia? Canberra is the capital, although Sydney is the largest city.

The function returns a list of numbers sorted from the smallest to the largest. If the input is
empty, it returns an empty list. Each call is independent, so the function is safe to use from
several threads at once, and it never changes the list that was passed to it.

Small models are useful for tests. They load in a moment, they fit in a few megabytes, and they
run on any computer. Their answers make no sense, but the code that serves them is the same code
that serves a large model on a rack of graphics cards, and that is what the tests are about.

The train left the station at nine. Through the window we saw fields, farms, a small church on a
hill, and cows standing in the long grass. A child in the next seat counted the bridges out loud,
one, two, three, four, until she fell asleep against her mother's arm somewhere after the river.

Thank you for your order. Your parcel will be shipped within two working days, and you will
receive a tracking number by email. If anything is missing or damaged, reply to this message and
our support team will help you as quickly as possible. We hope you enjoy your purchase.

In the garden, the tomatoes are ripe and the beans are climbing up the fence. The apple tree has
more fruit than we can eat this year, so we give bags of apples to the neighbours, who give us
jars of jam in return. It is an old arrangement, older than anyone can remember.

A user asks a question, the assistant answers, and the conversation goes on. The system message
sets the tone: be helpful, be brief, be honest. A developer message adds rules for the product.
A tool message carries the result of a function call back to the model so it can continue.

Numbers and dates appear everywhere: 2024, 2025, 2026; the 1st of March; 10:30 in the morning;
3.14159; 42; 100 percent; 7 days a week; 24 hours a day; 365 days a year; 1,000 requests per file.

The library opens at eight and closes at six. Students fill the reading room during exams, and
the quiet is so deep that you can hear pages turning on the far side of the hall. The librarian
knows every book by its colour and will find the one you need before you finish asking for it.

Science is a way of asking questions carefully. We make a guess, we test it, we look at what
happened, and we change our mind when the evidence says so. It is slow work, and most of the time
the answer is that we were wrong, which is also a kind of progress.

The meeting is moved to Thursday at three. Please bring the report, the budget for next year and
your ideas for the new office. Coffee will be served. If you cannot attend, send your comments
by email before Wednesday evening so that we can discuss them together.

Mountains rise above the valley like the backs of sleeping giants. In winter the passes close,
and the villages below live on what they stored in autumn: potatoes, cheese, smoked ham, dried
pears and barley. Travellers who arrive in January are rare, and they are welcomed with soup.

Engineers measure throughput in tokens per second and latency in milliseconds. A queue that grows
without limit is a bug waiting to happen; a queue with a deadline is a promise. Every worker
claims a lease, renews it while it works, and releases it when the result is safely written.

Music filled the square on the last night of the festival. Violins, accordions and a brass band
took turns on the wooden stage, and dancers spun in circles until their shoes were grey with dust.
Lanterns swayed from ropes between the balconies, orange and yellow against the violet sky.

Doctors recommend walking thirty minutes every day, drinking enough water, sleeping at regular
hours and eating vegetables, fruit, whole grains and fish. Exercise improves mood, memory and
concentration; even a short walk after lunch makes the afternoon feel lighter and more focused.

The museum keeps a collection of clocks: pendulum clocks, pocket watches, sundials, hourglasses
and an astronomical clock that shows the phases of the moon, the positions of the planets and
the dates of eclipses for the next century. Visitors gather at noon when all of them chime.

Invoices are due within thirty days. Prices include tax unless stated otherwise; discounts apply
to yearly subscriptions; refunds are processed within ten business days. Keep your receipt, your
customer number and the serial number of the device when you contact the service desk.

Foxes, badgers, owls and hedgehogs visit the orchard at night. The camera we hid behind the shed
recorded a family of foxes playing with an old tennis ball, chasing it between the beehives and
the compost heap until the cubs grew tired and curled up together under the wheelbarrow.

Chess rewards quiet thinking. The opening develops knights and bishops, castles the king and
fights for the centre; the middlegame hunts for weaknesses; the endgame turns a single extra pawn
into a queen. Grandmasters calculate deeply, yet they mostly trust patterns learned over decades.

Volcanic islands emerge from the ocean floor, grow for millions of years, then slowly erode and
sink. Coral reefs fringe their shores, lagoons shelter turtles, and seabirds nest on cliffs where
no cat or rat has ever climbed. Scientists visit by boat twice a year to count eggs and chicks.

Our quarterly review showed revenue up eight percent, expenses flat, churn slightly lower and
hiring behind plan. Priorities for next quarter: simplify onboarding, localize the dashboard into
Spanish, Japanese and German, negotiate cheaper storage, and publish the security audit summary.

Knitting a scarf requires needles, wool, patience and a pattern. Cast on forty stitches, knit two
rows, purl two rows, and repeat until the scarf reaches your knees. Beginners often drop stitches;
experienced knitters pick them up with a crochet hook without even looking at their hands.

Astronomers photographed a distant galaxy whose light left it before the Earth existed. Telescopes
in deserts and mountains, far from city glow, collect faint photons for hours; computers combine
thousands of exposures, subtract noise, and reveal spiral arms, dust lanes and bright young stars.

Bicycles need little maintenance: pump the tyres weekly, oil the chain monthly, check the brakes
before long journeys, and tighten loose bolts. Carry a spare tube, tyre levers and a small wrench.
Commuting by bike saves money, reduces traffic, and delivers you to work awake and cheerful.
"""


def build_demo_model(out_dir: Path, *, size: str = "tiny") -> Path:
    """Build the demo model of `size` into `out_dir` and return it.

    Idempotent: a directory that already holds a finished build is returned as is. The build is
    atomic (made in a sibling temporary directory, then renamed), so a crash or a concurrent build
    never leaves a half-written model behind under `out_dir`.
    """
    if size not in SIZES:
        raise ValueError(f"unknown demo model size {size!r}; choose from {sorted(SIZES)}")
    return build_atomically(out_dir, lambda tmp: _build_into(tmp, size), version=BUILD_VERSION)


def build_atomically(out_dir: Path, build: Callable[[Path], None], *, version: int) -> Path:
    """Run `build(tmp)` into a sibling temporary directory, then rename it to `out_dir`.

    `build` writes the MARKER file last. A finished build of `version` is returned as is; an
    older one is replaced whole.
    """
    out_dir = Path(out_dir)
    if (out_dir / MARKER).is_file():
        if _built_version(out_dir) == version:
            return out_dir
        # An older build: replaced whole (the weights are the same, the tokenizer is not).
        stale = out_dir.with_name(f".{out_dir.name}.stale-{os.getpid()}")
        os.rename(out_dir, stale)
        shutil.rmtree(stale, ignore_errors=True)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists but is not a finished demo model build")

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            # Another process finished the same build first: theirs is as good as ours.
            if (out_dir / MARKER).is_file():
                return out_dir
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _built_version(directory: Path) -> int | None:
    try:
        return int(json.loads((directory / MARKER).read_text()).get("build_version", 0))
    except (OSError, ValueError, AttributeError):
        return None


def demo_revision_fields(path: Path, size: str) -> dict[str, Any]:
    """Fields for `ModelRevision.objects.create(**fields)` serving the demo model at `path`."""
    if size not in SIZES:
        raise ValueError(f"unknown demo model size {size!r}; choose from {sorted(SIZES)}")
    return {
        "label": f"tiny-chat-{size}@demo-v{BUILD_VERSION}",
        "weights": str(Path(path).resolve()),
        "context_length": CONTEXT_LENGTH,
        "dtype": "auto",
        "modalities": ["text"],
        "dialect": "hermes",
    }


def _build_into(directory: Path, size: str) -> None:
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    spec = SIZES[size]
    tokenizer = build_tokenizer(spec.vocab_size)
    end_of_text = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    config = llama_config(
        spec,
        vocab_size=len(tokenizer),
        eos_token_id=[im_end, end_of_text],
        pad_token_id=end_of_text,
    )
    # A private RNG stream: builds are reproducible and the caller's global RNG is untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        model = LlamaForCausalLM(config)
    sharpen_output_head(model, spec.hidden_size)
    if size in _STORED_BF16:
        torch.nn.Module.to(model, torch.bfloat16)
    model.generation_config = GenerationConfig(
        eos_token_id=[im_end, end_of_text], pad_token_id=end_of_text
    )
    model.eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory, save_jinja_files=False)
    marker = {"size": size, **asdict(spec), "build_version": BUILD_VERSION, "seed": _SEED}
    (directory / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def llama_config(spec: DemoSize, *, vocab_size: int, **options: Any) -> Any:
    """The LlamaConfig of a demo model of shape `spec` (no weights are made)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=CONTEXT_LENGTH,
        bos_token_id=None,
        tie_word_embeddings=False,
        **options,
    )


def sharpen_output_head(model: Any, hidden_size: int) -> None:
    """Scale the output layer so that random logits are peaked (std ~3), not flat: greedy
    decoding then has clear winners, and batched and unbatched runs pick the same tokens."""
    import torch

    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.mul_(_LOGIT_STD / (head.std() * hidden_size**0.5))


def build_tokenizer(vocab_size: int, *, extra_specials: tuple[str, ...] = ()):
    """The demo's byte-level BPE tokenizer, with `extra_specials` (media placeholders) added as
    special tokens of their own."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [END_OF_TEXT, IM_START, IM_END, *extra_specials]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        extra_special_tokens=[IM_START, IM_END, *extra_specials],
        chat_template=CHAT_TEMPLATE,
        model_max_length=CONTEXT_LENGTH,
        clean_up_tokenization_spaces=False,
    )
