"""One engine across two tensor-parallel ranks (inference/engine/lockstep.py), on the CPU with
gloo and the real tiny model: token-exact against one rank, aborts and failures in lockstep,
a dead rank reported; and the rules that refuse what cannot be split."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from inference import runtime
from inference.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, load_model
from inference.engine.families import TEXT_FAMILIES
from inference.engine.lockstep import Channel, LockstepBroken, follow, followed_aborted
from inference.engine.parallel import (
    TENSOR_PARALLEL_FAMILIES,
    device_refusal,
    tensor_parallel_refusal,
)
from inference.engine.process import EngineProcess, EngineProcessError
from inference.engine.types import ConstraintSpec, PartialResult
from inference.models import ModelRevision
from tests.batches import conftest as batch_fixtures
from tests.batches.conftest import submit
from tests.conftest import Api, content_of, parse_jsonl, request_line

CONFIG = EngineConfig(context_length=512, max_batch_size=4)
in_process_worker = batch_fixtures.in_process_worker  # a worker runtime in this process


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path):
    return load_model(str(tiny_model_dir), device="cpu")


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir: Path, loaded):
    engine = EngineProcess(
        load={"weights": str(tiny_model_dir), "device": "cpu"},
        config=CONFIG,
        tokenizer=loaded[1],
        tensor_parallel_size=2,
    )
    yield engine
    engine.close()


def batch(tokenizer, *, seeded: bool = True) -> list[GenerationRequest]:
    """Greedy and sampled rows, one with n=2, more requests than rows."""
    texts = ["Hi.", "Tell me about the sea. " * 3, "Why?", "A longer question, " * 5]
    out = []
    for i in range(6):
        sampled = i % 2 == 1
        params = SamplingParams(
            max_new_tokens=8,
            temperature=0.8 if sampled else 0.0,
            seed=(100 + i) if sampled and seeded else None,
            n=2 if i == 3 else 1,
        )
        ids = tokenizer.encode(texts[i % 4], add_special_tokens=False)
        out.append(GenerationRequest(f"r{i}", ids, params))
    return out


def tokens(results) -> dict[str, list[list[int]]]:
    return {r.id: [c.token_ids for c in r.choices] for r in results}


@pytest.mark.model
def test_two_ranks_are_token_exact_against_one(two_ranks, loaded) -> None:
    model, tokenizer = loaded
    requests = batch(tokenizer)
    one = tokens(Engine(model, tokenizer, CONFIG).generate(requests))

    two = tokens(two_ranks.generate(iter(requests)))

    assert two == one
    assert all(choices and all(choices) for choices in two.values())
    # Again, now with the prompts in the ranks' prefix caches.
    assert tokens(two_ranks.generate(iter(requests))) == one
    assert not two_ranks.broken


@pytest.mark.model
def test_unseeded_rows_sample_on_every_rank_alike_and_keep_their_params(two_ranks, loaded):
    _, tokenizer = loaded
    requests = batch(tokenizer, seeded=False)

    results = list(two_ranks.generate(iter(requests)))

    assert {r.id for r in results} == {r.id for r in requests}
    assert all(r.error is None and r.choices for r in results)
    # The seed the leader chose for the ranks stays theirs: the result echoes the request.
    assert all(r.params is not None and r.params.seed is None for r in results)
    assert not two_ranks.broken


@pytest.mark.model
def test_aborts_and_a_failing_request_keep_the_ranks_in_lockstep(two_ranks, loaded) -> None:
    model, tokenizer = loaded
    requests = batch(tokenizer)
    long = GenerationRequest(
        "long", requests[0].prompt_ids, SamplingParams(max_new_tokens=400, ignore_eos=True)
    )
    # A grammar nothing matches: this row's sampling raises, on every rank alike.
    poison = GenerationRequest(
        "poison",
        requests[2].prompt_ids,
        SamplingParams(max_new_tokens=4, constraint=ConstraintSpec(grammar="%%% no grammar")),
    )
    stop = threading.Event()
    results = {}
    for result in two_ranks.generate(
        iter([long, poison, *requests]), aborted=lambda: {"long"} if stop.is_set() else set()
    ):
        results[result.id] = result
        stop.set()

    assert results["long"].aborted
    assert results["poison"].error == "internal_error"
    one = tokens(Engine(model, tokenizer, CONFIG).generate(requests))
    assert {k: v for k, v in tokens(results.values()).items() if k in one} == one
    # The next run still lines up on both ranks.
    assert tokens(two_ranks.generate(iter(requests))) == one
    assert not two_ranks.broken


@pytest.mark.model
def test_ranks_that_cannot_load_say_why(tmp_path: Path, loaded) -> None:
    with pytest.raises(EngineProcessError, match="cannot load"):
        EngineProcess(
            load={"weights": str(tmp_path / "absent"), "device": "cpu"},
            config=CONFIG,
            tokenizer=loaded[1],
            tensor_parallel_size=2,
        )


# -- what can be split -------------------------------------------------------------------------


def test_the_families_with_a_plan_are_transformers_own() -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    assert TENSOR_PARALLEL_FAMILIES.issubset(TEXT_FAMILIES)
    for model_type in TENSOR_PARALLEL_FAMILIES:
        assert CONFIG_MAPPING[model_type].base_model_tp_plan, model_type
    for model_type in ("gpt2", "falcon", "opt"):  # no plan: refused, not split wrong
        assert not getattr(CONFIG_MAPPING[model_type], "base_model_tp_plan", None)


def test_refusals_name_what_does_not_split() -> None:
    llama = {"model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 8}
    assert tensor_parallel_refusal(llama, 1) is None
    assert tensor_parallel_refusal(llama, 8) is None
    assert "8 key/value heads do not divide across 16" in str(tensor_parallel_refusal(llama, 16))
    assert "32 attention heads do not divide across 3" in str(tensor_parallel_refusal(llama, 3))
    assert "GPT-2 has no tensor-parallel plan" in str(
        tensor_parallel_refusal({"model_type": "gpt2", "n_head": 12}, 2)
    )
    assert "1 or more" in str(tensor_parallel_refusal(llama, 0))
    assert "needs 8 GPUs and this machine has 4" in str(device_refusal(8, 4))
    assert device_refusal(4, 4) is None and device_refusal(2, 0) is None  # CPU ranks


def model(*args: str) -> dict:
    out = io.StringIO()
    call_command("model", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


@pytest.mark.django_db
def test_model_add_checks_and_records_the_split(tiny_model_dir: Path, settings) -> None:
    settings.ENGINE_DEVICE = "cpu"
    found = model("inspect", str(tiny_model_dir), "--tensor-parallel-size", "2")
    assert found["tensor_parallel_size"] == 2
    assert any("split across 2 devices" in note for note in found["notes"])

    with pytest.raises(CommandError, match="4 attention heads do not divide across 3"):
        call_command("model", "add", "tp/three", "--weights", str(tiny_model_dir),
                     "--tensor-parallel-size", "3")  # fmt: skip
    # --check generates across the two ranks before the revision exists.
    added = model(
        "add", "tp/two", "--weights", str(tiny_model_dir), "--tensor-parallel-size", "2", "--check"
    )
    assert added["revision"]["tensor_parallel_size"] == 2
    assert ModelRevision.objects.get(id=added["revision"]["id"]).tensor_parallel_size == 2


def finished(api: Api, batch_id: str) -> dict:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        batch = api.get(f"/v1/batches/{batch_id}").json()
        if batch["status"] in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} did not finish")


@pytest.mark.model
@pytest.mark.django_db(transaction=True)
def test_a_batch_on_a_tensor_parallel_revision_answers_as_one_rank(
    tiny_model_dir: Path, api: Api, catalog_model, in_process_worker, settings
) -> None:
    settings.ENGINE_DEVICE = "cpu"
    settings.ENGINES_PER_PROCESS = 2  # the reference's engine beside it, not instead
    added = model(
        "add", "tp/chat", "--weights", str(tiny_model_dir), "--tensor-parallel-size", "2",
        "--price-input", "100", "--price-cached-input", "50", "--price-output", "400",
    )  # fmt: skip
    answers = {}
    try:
        for name in ("tp/chat", catalog_model.name):
            inputs = [
                request_line(f"t{i}", model=name, content=f"Question {i}?", temperature=0)
                for i in range(3)
            ]
            batch = finished(api, submit(api, inputs, key=name)["id"])
            assert batch["status"] == "completed", batch
            if name == "tp/chat":
                engine = runtime._engines[added["revision"]["id"]]
                assert isinstance(engine, EngineProcess) and len(engine._followers) == 1
                assert not engine.broken
            output = content_of(api.get(f"/v1/files/{batch['output_file_id']}/content"))
            answers[name] = {
                row["custom_id"]: row["response"]["body"]["choices"][0]["message"]["content"]
                for row in parse_jsonl(output)
            }
    finally:
        runtime.engine_drop(added["revision"]["id"])  # stops its ranks
    assert answers["tp/chat"] == answers[catalog_model.name] and len(answers["tp/chat"]) == 3


@pytest.mark.django_db
def test_the_admin_form_refuses_a_split_the_model_cannot_take(tiny_model_dir: Path) -> None:
    from inference.admin import ModelRevisionForm

    fields = {"label": "tp", "weights": str(tiny_model_dir), "context_length": 512,
              "dtype": "auto", "modalities": '["text"]'}  # fmt: skip
    form = ModelRevisionForm(data=fields | {"tensor_parallel_size": 3})
    assert not form.is_valid()
    assert "4 attention heads do not divide across 3" in str(form.errors)
    form = ModelRevisionForm(data=fields | {"tensor_parallel_size": 2})
    assert form.is_valid(), form.errors
    assert form.cleaned_data["tensor_parallel_size"] == 2


class Scripted(Channel):
    """The leader's broadcasts as a follower would receive them, from a list."""

    def __init__(self, messages: list) -> None:
        super().__init__(group=None, rank=1)
        self._messages = iter(messages)

    def share(self, message=None):
        return next(self._messages)


class Recording:
    """An engine core that records the verbs a follower applies to it."""

    def __init__(self) -> None:
        self.applied: list = []
        self.has_unfinished = False

    def add(self, request) -> None:
        self.applied.append(("add", request.id))

    def abort(self, ids) -> None:
        self.applied.append(("abort", list(ids)))

    def step(self, **options):
        self.applied.append(("step",))
        return []

    def clear_prefix_cache(self) -> None:
        self.applied.append(("clear_prefix_cache",))


def test_a_follower_applies_the_leaders_verbs_and_stops_where_they_part() -> None:
    request = GenerationRequest("a", [1, 2], SamplingParams(max_new_tokens=1))
    engine = Recording()
    verbs = [("add", request), ("step",), ("abort", ["a"]), ("clear_prefix_cache",), ("close",)]
    follow(engine, Scripted(verbs))
    assert engine.applied == [
        ("add", "a"),
        ("step",),
        ("abort", ["a"]),
        ("clear_prefix_cache",),
    ]
    # An answer where a verb was due (or a verb where the engine polled aborts): they parted.
    with pytest.raises(LockstepBroken, match="the leader sent 'aborted'"):
        follow(Recording(), Scripted([("aborted", [])]))
    with pytest.raises(LockstepBroken, match="asked for 'aborted'"):
        followed_aborted(Scripted([("step",)]))()
    # Not an Exception: containment must not take it for one request's failure.
    assert not issubclass(LockstepBroken, Exception)


@pytest.mark.model
def test_a_chat_beside_batch_is_paced_and_runs_decode_on_both_ranks_alike(two_ranks, loaded):
    """Pacing and decoding runs decide on the leader's clock (lockstep.agreement): a chat that
    streams beside greedy batch rows leaves every request with the tokens it has alone."""
    model, tokenizer = loaded
    rows = [
        GenerationRequest(
            f"g{i}",
            tokenizer.encode(f"Story number {i}, please.", add_special_tokens=False),
            SamplingParams(max_new_tokens=24 if i else 3, temperature=0.0),
        )
        for i in range(4)
    ]
    chat = GenerationRequest(
        "chat",
        tokenizer.encode("Hello there!", add_special_tokens=False),
        SamplingParams(max_new_tokens=8, temperature=0.0),
        priority=1,
        stream=True,
    )
    one = Engine(model, tokenizer, CONFIG)
    alone = {
        r.id: tokens(o for o in one.generate([r]) if not isinstance(o, PartialResult))[r.id]
        for r in [*rows, chat]
    }
    partials = []
    results = {}
    for output in two_ranks.generate(iter([*rows, chat])):
        if isinstance(output, PartialResult):
            partials.append(output)
        else:
            results[output.id] = output

    assert tokens(results.values()) == alone
    assert partials and {p.id for p in partials} == {"chat"}
    assert not two_ranks.broken


@pytest.mark.model
def test_a_rank_that_dies_breaks_the_engine(two_ranks, loaded) -> None:
    """Last of the file's uses of the shared engine: it breaks it."""
    follower = two_ranks._followers[0][0]
    os.kill(follower.pid, 9)
    follower.join(timeout=10)

    assert list(two_ranks.generate(iter(batch(loaded[1])))) == []
    assert two_ranks.broken
    two_ranks.close()
    assert not follower.is_alive() and not two_ranks._process.is_alive()
