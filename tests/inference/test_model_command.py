"""`manage.py model`: an operator puts a downloaded directory in the catalog (issue 28, item 1).

Real directories throughout: the tiny demo model as built, and copies of it broken on purpose.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from batches.models import Batch
from inference.models import CatalogModel, Deployment, ModelRevision
from tests.batches.conftest import rows, submit
from tests.conftest import Api, Tenant

pytestmark = pytest.mark.django_db


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
    assert found["tool_call_format"] == "hermes"
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
    ],
)
def test_inspect_and_add_refuse_what_the_engine_cannot_serve(broken, change, reason):
    path = str(broken(change))
    message, printed = refused("inspect", path)
    assert reason in message and printed["error"]["message"] == message
    message, _ = refused("add", "acme/broken", "--weights", path)
    assert reason in message


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
    assert revision.context_length == 2048 and revision.tool_call_format == "hermes"
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
    message, _ = refused("disable", "acme/private")
    assert "private deployment" in message


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


def test_disable_takes_a_model_off_batch(api: Api, catalog_model):
    assert model("disable", catalog_model.name)["batch"] is False
    listed = api.get("/v1/models").json()["data"]
    assert [m["batch"] for m in listed if m["id"] == catalog_model.name] == [None]


def test_the_admin_refuses_a_revision_the_engine_cannot_serve(client, broken, tiny_model_dir):
    client.force_login(User.objects.create_superuser("staff", "s@example.com", "pw"))
    path = broken(lambda p: _edit_json(p / "config.json", model_type="mamba"))
    form = {
        "label": "x", "weights": str(path), "context_length": 2048, "dtype": "auto",
        "modalities": '["text"]', "tool_call_format": "",
    }  # fmt: skip
    response = client.post("/admin/inference/modelrevision/add/", form)
    assert response.status_code == 200
    assert "This model cannot be served" in response.content.decode()
    assert not ModelRevision.objects.exists()
    ok = client.post("/admin/inference/modelrevision/add/", form | {"weights": str(tiny_model_dir)})
    assert ok.status_code == 302
    assert ModelRevision.objects.get().weights == str(tiny_model_dir)
