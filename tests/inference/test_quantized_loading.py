"""Quantized directories: `model inspect` reports the method, bits and bytes on disk; `model
add` refuses what this machine cannot load (bitsandbytes without CUDA, a GPTQ/AWQ kernel
package not installed), and so does the loader. The directories are the tiny model with a
`quantization_config` written into its config: the rules read the config, not the tensors."""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from inference.engine.loading import ModelLoadError, load_model
from inference.models import ModelRevision

pytestmark = pytest.mark.django_db

BNB_4BIT = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}


@pytest.fixture
def quantized(tiny_model_dir: Path, tmp_path: Path):
    def make(config: dict[str, Any]) -> Path:
        target = tmp_path / str(config.get("quant_method") or "legacy")
        shutil.copytree(tiny_model_dir, target)
        path = target / "config.json"
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "quantization_config": config}))
        return target

    return make


def model(*args: str) -> dict[str, Any]:
    out = io.StringIO()
    call_command("model", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def refused(*args: str) -> str:
    with pytest.raises(CommandError) as caught:
        call_command("model", *args, stdout=io.StringIO())
    assert not ModelRevision.objects.exists()
    return str(caught.value)


def test_inspect_reports_the_quantization_and_add_refuses_bitsandbytes_on_the_cpu(
    quantized, settings
) -> None:
    settings.ENGINE_DEVICE = "cpu"
    path = quantized(BNB_4BIT)

    found = model("inspect", str(path))

    assert found["quantization"] == {"quant_method": "bitsandbytes", "bits": 4}
    assert found["weight_bytes"] > 0
    assert any("quantized with bitsandbytes (4-bit)" in note for note in found["notes"])
    assert any("need a CUDA device" in note for note in found["notes"])
    message = refused("add", "q/bnb", "--weights", str(path))
    assert "bitsandbytes 4-bit weights need a CUDA device" in message


def test_a_config_from_before_quant_method_is_bitsandbytes_8bit(quantized, settings) -> None:
    settings.ENGINE_DEVICE = "cpu"
    path = quantized({"load_in_8bit": True})

    assert model("inspect", str(path))["quantization"] == {
        "quant_method": "bitsandbytes",
        "bits": 8,
    }
    assert "8-bit weights need a CUDA device" in refused("add", "q/bnb8", "--weights", str(path))


def test_the_loader_refuses_bitsandbytes_on_the_cpu_too(quantized) -> None:
    with pytest.raises(ModelLoadError, match="need a CUDA device"):
        load_model(str(quantized(BNB_4BIT)), device="cpu")


@pytest.mark.parametrize(
    ("config", "packages"), [(GPTQ, ("optimum", "gptqmodel")), (AWQ, ("gptqmodel",))]
)
def test_gptq_and_awq_need_their_kernel_packages(quantized, settings, config, packages) -> None:
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if not missing:
        pytest.skip(f"{', '.join(packages)} installed here: the directory would load")
    settings.ENGINE_DEVICE = "cpu"
    path = quantized(config)

    found = model("inspect", str(path))

    assert found["quantization"] == {"quant_method": config["quant_method"], "bits": 4,
                                     "group_size": 128}  # fmt: skip
    message = refused("add", f"q/{config['quant_method']}", "--weights", str(path))
    assert f"pip install {' '.join(missing)}" in message


def test_unknown_methods_and_quantized_splits_are_refused(quantized) -> None:
    assert "'hqq' are not served" in refused(
        "inspect", str(quantized({"quant_method": "hqq", "nbits": 4}))
    )
    assert "tensor_parallel_size 1" in refused(
        "inspect", str(quantized(GPTQ)), "--tensor-parallel-size", "2"
    )
