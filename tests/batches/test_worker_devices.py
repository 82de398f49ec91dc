"""`run_worker --device/--devices` refuse devices the machine does not have, before anything
starts. The supervisor itself runs in the fault suite (real processes)."""

from __future__ import annotations

import pytest
import torch
from django.core.management import call_command
from django.core.management.base import CommandError

from project.worker_supervisor import devices_parse

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without GPUs")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "gpu7"], "unknown device 'gpu7': use cpu, cuda or cuda:N"),
        (["--device", "cuda:0"], "cuda:0: no CUDA device is visible on this machine; use cpu"),
        (["--devices", "all"], "--devices all: no CUDA device is visible; use --device cpu"),
        (["--devices", "cpu,cuda:3"], "cuda:3: no CUDA device is visible"),
        (["--devices", ","], "--devices takes all or a list"),
    ],
)
def test_a_device_this_machine_lacks_is_refused_naming_what_it_has(args, message, settings):
    settings.REDIS_URL = ""  # the device check comes first: it is the operator's mistake
    with pytest.raises(CommandError, match=message):
        call_command("run_worker", *args)


def test_device_and_devices_are_exclusive():
    with pytest.raises(CommandError, match="not allowed with argument"):
        call_command("run_worker", "--device", "cpu", "--devices", "cpu")


def test_a_device_list_is_kept_in_order():
    assert devices_parse("cpu, cpu") == ["cpu", "cpu"]
