"""`manage.py model`: an operator puts a downloaded directory in the catalog (issue 28, item 1).

Real directories throughout: the tiny demo model as built, and copies of it broken on purpose.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from batches.models import Batch
from inference.models import CatalogModel, Deployment, ModelRevision
from tests.batches.conftest import finalize, rows, run_worker, submit
from tests.conftest import PRICES, Api, Tenant, jsonl

pytestmark = pytest.mark.django_db

CHAT = {
    "model": "boardwalk/tiny-chat",
    "messages": [{"role": "user", "content": "Hello"}],
    "max_completion_tokens": 4,
}


def model(*args: str) -> dict[str, Any]:
    out = io.StringIO()
    call_command("model", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def refused(*args: str) -> tuple[str, dict[str, Any]]:
    """The refusal's message and the JSON error it printed; nothing may have been created."""
    before = (
        ModelRevision.objects.count(),
        CatalogModel.objects.count(),
        Deployment.objects.count(),
    )
    out = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("model", "--json", *args, stdout=out)
    after = (
        ModelRevision.objects.count(),
        CatalogModel.objects.count(),
        Deployment.objects.count(),
    )
    assert after == before
    return str(caught.value), json.loads(out.getvalue())


@pytest.fixture
def broken(tiny_model_dir: Path, tmp_path: Path):
    """A copy of the tiny model with one thing changed."""

    def make(change) -> Path:
        target = tmp_path / f"model-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(tiny_model_dir, target)
        change(target)
        return target

    return make


def _edit_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def test_inspect_describes_the_revision_without_loading_weights(tiny_model_dir: Path):
    found = model("inspect", str(tiny_model_dir))
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert found["architecture"] == "LlamaForCausalLM" and found["model_type"] == "llama"
    assert found["context_length"] == config["max_position_embeddings"]
    assert found["dtype"] == "auto"
    weights = (tiny_model_dir / "model.safetensors").stat().st_size
    assert 0 < found["weight_bytes"] < weights  # the tensors, less the header
    assert found["parameters"] * 4 == found["weight_bytes"]  # float32 weights
    layers, heads = config["num_hidden_layers"], config["num_key_value_heads"]
    assert found["kv_bytes_per_token"] == layers * heads * config["head_dim"] * 2 * 2  # bf16
    assert found["modalities"] == ["text"]
    assert found["dialect"] == "hermes"
    assert found["eos_token_ids"] == config["eos_token_id"]
    assert found["quantization"] is None
    shorter = model("inspect", str(tiny_model_dir), "--context-length", "512", "--dtype", "float32")
    assert shorter["context_length"] == 512
    assert shorter["kv_bytes_per_token"] == found["kv_bytes_per_token"] * 2


def test_inspect_reports_quantization(broken):
    path = broken(
        lambda p: _edit_json(
            p / "config.json", quantization_config={"quant_method": "bitsandbytes", "bits": 4}
        )
    )
    assert model("inspect", str(path))["quantization"] == {
        "quant_method": "bitsandbytes",
        "bits": 4,
    }


def _huge_tensor(path: Path) -> None:
    """Rewrite the safetensors header: its first tensor claims a [2^40, 2^40] shape."""
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    first = next(k for k in header if k != "__metadata__")
    header[first]["shape"] = [2**40, 2**40]
    raw = json.dumps(header).encode()
    weights.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + size :])


def _template(text: str):
    return lambda p: _edit_json(p / "tokenizer_config.json", chat_template=text)


NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda p: _edit_json(p / "tokenizer_config.json", chat_template=None), "no chat template"),
        (lambda p: _edit_json(p / "config.json", model_type="mamba"), "'mamba' is not one"),
        (lambda p: (p / "model.safetensors").unlink(), "no weights"),
        (lambda p: (p / "tokenizer.json").write_text("{not json"), "does not load offline"),
        (lambda p: (p / "tokenizer.json").unlink(), "tokenizer.json is missing"),
        (lambda p: (p / "config.json").unlink(), "config.json is missing"),
        (lambda p: _edit_json(p / "config.json", model_type="bloom"), "BLOOM with ALiBi"),
        (
            lambda p: _edit_json(p / "config.json", model_type="falcon", alibi=True),
            "ALiBi",
        ),
        (
            lambda p: (p / "model.safetensors").rename(p / "pytorch_model.bin"),
            "pickled",
        ),
        (
            lambda p: _edit_json(p / "config.json", max_position_embeddings=2**62),
            "from 1 to 16777216",
        ),
        (lambda p: _edit_json(p / "config.json", num_hidden_layers=10**9), "num_hidden_layers"),
        (lambda p: _edit_json(p / "config.json", num_hidden_layers=-5), "from 1 to 1024"),
        (_huge_tensor, "would take"),
        (lambda p: _edit_json(p / "generation_config.json", eos_token_id=[2, None]), "None"),
        (lambda p: _edit_json(p / "generation_config.json", eos_token_id=10**6), "from 0 to"),
        (_template(NESTED_LOOPS), "looped more than"),
        (_template("{% set x = 'a' * 200000000 %}{{ x }}"), "produced more than"),
        (_template("{{ messages[0].content.nope() }}"), "fails on a plain conversation"),
    ],
)
def test_inspect_and_add_refuse_what_the_engine_cannot_serve(broken, change, reason):
    """Bad files are refused with a message, never a traceback, and nothing is created."""
    path = str(broken(change))
    message, printed = refused("inspect", path)
    assert reason in message and printed["error"]["message"] == message
    message, _ = refused("add", "acme/broken", "--weights", path)
    assert reason in message


def test_pickled_weights_beside_safetensors_are_ignored_and_never_opened(broken):
    path = broken(lambda p: (p / "pytorch_model.bin").write_bytes(b"not a pickle"))
    notes = model("inspect", str(path))["notes"]
    assert any("ignored: pytorch_model.bin" in note for note in notes)
    from inference.engine.loading import load_model

    model_, _ = load_model(str(path), device="cpu")  # it would fail on the .bin
    assert model_.config.model_type == "llama"


def test_truncated_weights_are_a_load_error_not_a_crash(broken):
    from inference.engine.loading import ModelLoadError, load_model

    def truncate(path: Path) -> None:
        weights = path / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-1000])

    with pytest.raises(ModelLoadError):
        load_model(str(broken(truncate)), device="cpu")


def test_inspect_refuses_a_longer_context_than_the_models(tiny_model_dir: Path):
    message, _ = refused("inspect", str(tiny_model_dir), "--context-length", "999999")
    assert "between 1 and the model's 2048" in message


def test_add_checks_the_model_runs_then_lists_it_for_batch(tiny_model_dir: Path, api: Api):
    added = model(
        "add", "acme/chat", "--weights", str(tiny_model_dir), "--price-input", "100",
        "--price-cached-input", "50", "--price-output", "400", "--check",
    )  # fmt: skip
    assert added["kind"] == "catalog" and added["batch"] is True
    assert added["prices"] == {"input": 100, "cached_input": 50, "output": 400}
    revision = ModelRevision.objects.get(id=added["revision"]["id"])
    assert revision.weights == str(tiny_model_dir.resolve())
    assert revision.context_length == 2048 and revision.dialect == "hermes"
    listed = model("list")
    assert [m["name"] for m in listed["catalog"]] == ["acme/chat"]
    # Users can run batches on it right away.
    data = submit(api, rows(1, model="acme/chat"), key="m-1")
    assert Batch.objects.get(id=data["id"]).revision_id == revision.id


def test_add_refuses_bad_combinations_and_taken_names(tiny_model_dir: Path, catalog_model):
    weights = str(tiny_model_dir)
    message, _ = refused("add", catalog_model.name, "--weights", weights)
    assert "already used" in message
    message, _ = refused("add", "acme/x", "--weights", weights, "--price-input", "1")
    assert "all three" in message
    message, _ = refused("add", "acme/x", "--weights", weights, "--deployment")
    assert "--org and --gpu-second-price" in message
    message, _ = refused("add", "acme/x", "--weights", weights, "--batch-media", "image")
    assert "cannot publish it" in message
    message, _ = refused(
        "add", "acme/x", "--weights", weights, "--deployment", "--org", "nobody",
        "--gpu-second-price", "5",
    )  # fmt: skip
    assert "No organization" in message


def test_add_a_private_deployment(tiny_model_dir: Path, tenant: Tenant):
    added = model(
        "add", "acme/private", "--weights", str(tiny_model_dir), "--deployment",
        "--org", tenant.org.name, "--gpu-second-price", "7",
    )  # fmt: skip
    deployment = Deployment.objects.get(name="acme/private")
    assert added["kind"] == "deployment" and deployment.org == tenant.org
    assert deployment.gpu_second_price == 7
    assert [d["name"] for d in model("list")["deployments"]] == ["acme/private"]


def test_set_revision_keeps_accepted_batches_on_theirs(
    tiny_model_dir: Path, api: Api, catalog_model
):
    data = submit(api, rows(1), key="s-1")
    old = catalog_model.revision_id
    changed = model("set-revision", catalog_model.name, "--weights", str(tiny_model_dir),
                    "--context-length", "1024")  # fmt: skip
    assert changed["revision"]["id"] != old and changed["revision"]["context_length"] == 1024
    assert CatalogModel.objects.get(pk=catalog_model.pk).revision_id == changed["revision"]["id"]
    assert Batch.objects.get(id=data["id"]).revision_id == old
    message, _ = refused("set-revision", "acme/none", "--weights", str(tiny_model_dir))
    assert "no catalog model or deployment" in message


def test_disable_stops_new_work_keeps_accepted_batches_and_enable_undoes_it(
    api: Api, catalog_model
):
    accepted = submit(api, rows(1), key="d-1")
    disabled = model("disable", catalog_model.name)
    assert disabled["enabled"] is False
    listed = api.get("/v1/models").json()["data"]
    assert [m["batch"] for m in listed if m["id"] == catalog_model.name] == [None]
    upload = api.upload(jsonl(*rows(1)))
    assert upload.status_code == 400
    assert upload.json()["error"]["details"][0]["code"] == "model_disabled"
    chat = api.post("/v1/chat/completions", CHAT)
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "model_disabled"
    assert accepted["id"] in run_worker(accepted["id"])  # an accepted batch keeps running
    assert finalize(accepted["id"]).status == "completed"  # type: ignore[union-attr]
    enabled = model("enable", catalog_model.name)
    assert enabled["enabled"] is True and enabled["batch"] is True
    assert enabled["prices"] == dict(zip(("input", "cached_input", "output"), PRICES, strict=True))
    submit(api, rows(1), key="d-2")


def test_disable_and_enable_a_private_deployment(api: Api, deployment):
    accepted = submit(api, rows(1, model=deployment.name), key="p-1")
    assert model("disable", deployment.name)["enabled"] is False
    upload = api.upload(jsonl(*rows(1, model=deployment.name)))
    assert upload.json()["error"]["details"][0]["code"] == "model_disabled"
    chat = api.post("/v1/chat/completions", CHAT | {"model": deployment.name})
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "model_disabled"
    assert accepted["id"] in run_worker(accepted["id"])
    assert finalize(accepted["id"]).status == "completed"  # type: ignore[union-attr]
    assert model("enable", deployment.name)["enabled"] is True
    submit(api, rows(1, model=deployment.name), key="p-2")
    message, _ = refused("enable", "acme/none")
    assert "no catalog model or deployment" in message


def test_add_takes_interactive_prices_at_least_the_batch_ones(tiny_model_dir: Path):
    weights = str(tiny_model_dir)
    batch = ("--price-input", "100", "--price-cached-input", "50", "--price-output", "400")
    message, printed = refused(
        "add", "acme/chat", "--weights", weights, *batch, "--interactive-input", "200",
        "--interactive-cached-input", "40", "--interactive-output", "800",
    )  # fmt: skip
    assert "cached_input 40 < 50" in message and printed["error"]["message"] == message
    message, _ = refused("add", "acme/chat", "--weights", weights, "--interactive-input", "1")
    assert "all three of --interactive-input" in message
    added = model(
        "add", "acme/chat", "--weights", weights, *batch, "--interactive-input", "200",
        "--interactive-cached-input", "50", "--interactive-output", "800",
    )  # fmt: skip
    assert added["interactive_prices"] == {"input": 200, "cached_input": 50, "output": 800}
    catalog = CatalogModel.objects.get(name="acme/chat")
    assert catalog.interactive_prices == (200, 50, 800)
    # Without interactive flags the model is not offered interactively (never free).
    plain = model("add", "acme/batch-only", "--weights", weights, *batch)
    assert plain["interactive_prices"] is None
    assert CatalogModel.objects.get(name="acme/batch-only").interactive_prices is None


def test_set_price_changes_batch_and_interactive_prices(api: Api, catalog_model, deployment):
    name = catalog_model.name
    changed = model(
        "set-price", name, "--interactive-input", "500000", "--interactive-cached-input",
        "200000", "--interactive-output", "2000000",
    )  # fmt: skip
    assert changed["interactive_prices"] == {
        "input": 500_000, "cached_input": 200_000, "output": 2_000_000,
    }  # fmt: skip
    assert changed["prices"] == dict(zip(("input", "cached_input", "output"), PRICES, strict=True))
    message, _ = refused("set-price", name, "--price-input", "600000",
                         "--price-cached-input", "1", "--price-output", "1")  # fmt: skip
    assert "input 500000 < 600000" in message
    assert CatalogModel.objects.get(pk=catalog_model.pk).price_input == PRICES[0]
    off = model("set-price", name, "--no-interactive")
    assert off["interactive_prices"] is None and off["batch"] is True
    chat = api.post("/v1/chat/completions", CHAT)
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "model_not_interactive"
    assert model("set-price", name, "--no-batch")["batch"] is False
    message, _ = refused("set-price", name)
    assert "nothing to set" in message
    message, _ = refused("set-price", deployment.name, "--no-batch")
    assert "private deployment" in message


def test_json_is_taken_after_the_subcommand_too(tiny_model_dir: Path, catalog_model):
    for args in (("--json", "list"), ("list", "--json")):
        out = io.StringIO()
        call_command("model", *args, stdout=out)
        assert [m["name"] for m in json.loads(out.getvalue())["catalog"]] == [catalog_model.name]
    out = io.StringIO()
    call_command("model", "inspect", str(tiny_model_dir), "--json", stdout=out)
    assert json.loads(out.getvalue())["model_type"] == "llama"
    out = io.StringIO()
    call_command("model", "list", stdout=out)
    assert out.getvalue().startswith("NAME")  # text without --json


def test_check_reports_what_it_generated_and_refuses_truncated_weights(broken, tiny_model_dir):
    out = io.StringIO()
    call_command("model", "add", "acme/checked", "--weights", str(tiny_model_dir), "--check",
                 stdout=out)  # fmt: skip
    assert "check: {'ok': True" in out.getvalue()

    def truncate(path: Path) -> None:
        weights = path / "model.safetensors"
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])

    path = broken(truncate)
    # inspect reads only the header, which a truncated file still has: it refuses the file
    # its header does not cover.
    message, _ = refused("inspect", str(path))
    assert "truncated" in message


def test_the_admin_refuses_a_revision_the_engine_cannot_serve(client, broken, tiny_model_dir):
    client.force_login(User.objects.create_superuser("staff", "s@example.com", "pw"))
    path = broken(lambda p: _edit_json(p / "config.json", model_type="mamba"))
    form = {
        "label": "x", "weights": str(path), "context_length": 2048, "dtype": "auto",
        "modalities": '["text"]', "dialect": "",
    }  # fmt: skip
    response = client.post("/admin/inference/modelrevision/add/", form)
    assert response.status_code == 200
    assert "This model cannot be served" in response.content.decode()
    assert not ModelRevision.objects.exists()
    ok = client.post("/admin/inference/modelrevision/add/", form | {"weights": str(tiny_model_dir)})
    assert ok.status_code == 302
    assert ModelRevision.objects.get().weights == str(tiny_model_dir)


def test_inspect_names_the_dialect_and_dialect_overrides_it(tiny_model_dir: Path):
    found = model("inspect", str(tiny_model_dir))
    assert found["dialect"] == "hermes"
    assert found["notes"][0].startswith("dialect hermes (found in the chat template):")
    assert "tool calls in the hermes syntax" in found["notes"][0]
    chosen = model("inspect", str(tiny_model_dir), "--dialect", "qwen3")
    assert chosen["dialect"] == "qwen3"
    assert chosen["notes"][0].startswith("dialect qwen3 (chosen with --dialect):")
    assert "reasoning_effort none/minimal/low/medium/high/xhigh" in chosen["notes"][0]
    message, _ = refused("inspect", str(tiny_model_dir), "--dialect", "klingon")
    assert "unknown dialect 'klingon'; choose one of hermes, qwen3" in message


def test_add_records_the_dialect_chosen(tiny_model_dir: Path):
    made = model("add", "acme/thinker", "--weights", str(tiny_model_dir), "--dialect", "qwen3")
    assert made["revision"]["dialect"] == "qwen3"
    assert ModelRevision.objects.get(id=made["revision"]["id"]).dialect == "qwen3"


def test_a_template_no_dialect_knows_is_plain_and_inspect_says_what_that_means(
    tiny_model_dir: Path, tmp_path: Path
):
    target = tmp_path / "plain-model"
    shutil.copytree(tiny_model_dir, target)
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"
    )
    config_path.write_text(json.dumps(config))
    (target / "chat_template.jinja").unlink(missing_ok=True)
    found = model("inspect", str(target))
    assert found["dialect"] == "plain"
    assert (
        "replies are plain text, and rows with tools or reasoning_effort are refused"
        in (found["notes"][0])
    )
